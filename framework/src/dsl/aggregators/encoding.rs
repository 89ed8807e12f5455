//! The state encoding shared by the aggregators: lengths, members, a reader.

use super::*;

pub(super) fn put_u32(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
}

pub(super) fn put_member(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u32(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// Reads a state: the header, then fields.
pub(super) struct Reader<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) what: &'static str,
}

impl<'a> Reader<'a> {
    pub(super) fn new(
        data: Option<&'a [u8]>,
        kind: u8,
        what: &'static str,
    ) -> Result<Self, SerdeError> {
        let bytes = data.ok_or_else(|| SerdeError(format!("{what} state: null")))?;
        let mut reader = Reader { bytes, what };
        let version = reader.u8()?;
        if version != FORMAT_VERSION {
            return Err(SerdeError(format!(
                "{what} state: unknown format version {version} (this release reads {FORMAT_VERSION})"
            )));
        }
        let found = reader.u8()?;
        if found != kind {
            return Err(SerdeError(format!(
                "{what} state: kind {:?}, expected {:?} (another aggregation's state?)",
                char::from(found),
                char::from(kind)
            )));
        }
        Ok(reader)
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], SerdeError> {
        if self.bytes.len() < n {
            return Err(SerdeError(format!("{} state: truncated", self.what)));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    pub(super) fn u8(&mut self) -> Result<u8, SerdeError> {
        Ok(self.take(1)?[0])
    }

    pub(super) fn u32(&mut self) -> Result<usize, SerdeError> {
        let mut buf = [0u8; 4];
        buf.copy_from_slice(self.take(4)?);
        Ok(u32::from_be_bytes(buf) as usize)
    }

    pub(super) fn bytes8(&mut self) -> Result<[u8; 8], SerdeError> {
        let mut buf = [0u8; 8];
        buf.copy_from_slice(self.take(8)?);
        Ok(buf)
    }

    pub(super) fn u64(&mut self) -> Result<u64, SerdeError> {
        Ok(u64::from_be_bytes(self.bytes8()?))
    }

    pub(super) fn member<M: 'static>(
        &mut self,
        serde: &dyn Serde<M>,
    ) -> Result<(M, Vec<u8>), SerdeError> {
        let n = self.u32()?;
        let bytes = self.take(n)?.to_vec();
        let member = serde.deserialize(Some(&bytes)).map_err(|e| {
            SerdeError(format!(
                "{} state: a member does not decode: {e}",
                self.what
            ))
        })?;
        Ok((member, bytes))
    }

    pub(super) fn finish(&self) -> Result<(), SerdeError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(SerdeError(format!(
                "{} state: {} bytes after the end",
                self.what,
                self.bytes.len()
            )))
        }
    }
}

pub(super) fn header(kind: u8) -> Vec<u8> {
    vec![FORMAT_VERSION, kind]
}
