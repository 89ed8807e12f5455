//! Exactly-once output to Kafka (design notes, section 5a): per source partition of the
//! event a transactional producer with a stable `transactional.id`, the partition's
//! progress in a shadow consumer group committed inside each transaction.

/// Whether `id` can prefix transactional ids and a consumer group: Kafka topic-name
/// characters (`A-Z a-z 0-9 . _ -`), 1 to 200 of them; `Err` says why not.
pub fn check_application_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > 200 {
        return Err("must be 1 to 200 characters".into());
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "holds {c:?}: use the characters of Kafka topic names (A-Z a-z 0-9 . _ -)"
        ));
    }
    Ok(())
}
