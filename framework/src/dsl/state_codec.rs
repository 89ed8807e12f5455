//! The one codec of the internal states the DSL keeps as JSON (sessions, sliding-window
//! records, join buffers and join states): JSON encoding and decoding, an absent item read
//! as the empty state, bytes inside the JSON as base64, and errors that name the state.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::serdes::SerdeError;

/// The JSON codec of one kind of internal state; `what` names it in errors ("sessions").
#[derive(Debug, Clone, Copy)]
pub(crate) struct StateCodec {
    what: &'static str,
}

impl StateCodec {
    /// The codec of the state named `what`.
    pub(crate) const fn new(what: &'static str) -> Self {
        StateCodec { what }
    }

    /// The stored form, as JSON.
    pub(crate) fn encode<S: Serialize + ?Sized>(
        &self,
        stored: &S,
    ) -> Result<Option<Vec<u8>>, SerdeError> {
        serde_json::to_vec(stored)
            .map(Some)
            .map_err(|e| SerdeError(format!("cannot encode {}: {e}", self.what)))
    }

    /// The stored form of `data`; no item yet (`None`) is the empty stored form.
    pub(crate) fn decode<S: DeserializeOwned + Default>(
        &self,
        data: Option<&[u8]>,
    ) -> Result<S, SerdeError> {
        match data {
            None => Ok(S::default()),
            Some(bytes) => serde_json::from_slice(bytes).map_err(|e| self.error(e)),
        }
    }

    /// Bytes inside the JSON: base64.
    pub(crate) fn encode_bytes(&self, bytes: &[u8]) -> String {
        STANDARD.encode(bytes)
    }

    /// Bytes read back from [`encode_bytes`](Self::encode_bytes)' text.
    pub(crate) fn decode_bytes(&self, text: &str) -> Result<Vec<u8>, SerdeError> {
        STANDARD.decode(text).map_err(|e| self.error(e))
    }

    /// A stored state that does not decode.
    pub(crate) fn error(&self, e: impl std::fmt::Display) -> SerdeError {
        SerdeError(format!("cannot decode the stored {}: {e}", self.what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_is_empty_and_errors_name_the_state() {
        let codec = StateCodec::new("sessions");
        assert_eq!(codec.decode::<Vec<i64>>(None), Ok(Vec::new()));
        let bytes = codec.encode(&[1i64, 2]).unwrap().unwrap();
        assert_eq!(bytes, b"[1,2]");
        assert_eq!(codec.decode::<Vec<i64>>(Some(&bytes)), Ok(vec![1, 2]));
        let error = codec.decode::<Vec<i64>>(Some(b"{")).unwrap_err();
        assert!(
            error.0.starts_with("cannot decode the stored sessions: "),
            "{error}"
        );
        // base64 as RFC 4648 writes "fox".
        assert_eq!(codec.encode_bytes(b"fox"), "Zm94");
        assert_eq!(codec.decode_bytes("Zm94"), Ok(b"fox".to_vec()));
        assert!(codec.decode_bytes("%").is_err());
    }
}
