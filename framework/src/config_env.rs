//! Reading a function's own settings from the environment: one helper for every
//! function crate (topic names and the like), with the convention the framework's own
//! variables follow, so that an unset variable and one set to the empty string (as a
//! template that leaves a parameter blank writes it) mean the same thing.

/// The value of the environment variable `name`, or `default` when it is unset, empty,
/// or not valid Unicode.
///
/// ```
/// use lambda_streams::config_env::env_or;
/// // SAFETY: the doctest runs on one thread; nothing else reads the environment.
/// unsafe { std::env::set_var("EXAMPLE_OUTPUT_TOPIC", "") };
/// assert_eq!(env_or("EXAMPLE_OUTPUT_TOPIC", "word-counts"), "word-counts");
/// unsafe { std::env::set_var("EXAMPLE_OUTPUT_TOPIC", "counts-v2") };
/// assert_eq!(env_or("EXAMPLE_OUTPUT_TOPIC", "word-counts"), "counts-v2");
/// ```
pub fn env_or(name: &str, default: impl Into<String>) -> String {
    std::env::var(name)
        .ok()
        .filter(|value| !value.is_empty())
        .unwrap_or_else(|| default.into())
}
