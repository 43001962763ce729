//! The cryptography of sealing, on `ring` (already built for rustls):
//! AES-256-GCM for blocks (hardware AES and carry-less multiply make it
//! several times faster per core than ChaCha20-Poly1305 here; the numbers
//! are in docs/performance.md), HMAC-SHA-256 to derive subkeys and to name blocks.
//!
//! Three subkeys come from the tenant's key, each for one job, so that no key
//! serves two purposes: the payload AEAD, the key-field AEAD (the same nonce
//! under another key is safe), and the name PRF.

use super::key::{wipe, SealKey};
use super::record::{
    self, Nonce, BINDING_LEN, FORMAT_VERSION, KEY_FIELD_AT, KEY_FIELD_LEN, KEY_TAG_AT,
    MAX_PAYLOAD_AAD, NEWER, PAYLOAD_TAG_AT, RECORD_LEN, TAG_LEN,
};
use crate::error::{Error, ErrorKind, Result};
use ring::aead::{self, Aad, LessSafeKey, UnboundKey};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use std::mem::MaybeUninit;
use std::ptr::NonNull;

/// Bytes of the name PRF kept: 128 bits, so neither a collision between two
/// keys nor a guess of a name is a practical concern.
pub(crate) const NAME_TAG_LEN: usize = 16;
pub(crate) type NameTag = [u8; NAME_TAG_LEN];

/// A heap value whose bytes are wiped when it is dropped: `ring`'s expanded
/// keys (an AES-256 key schedule begins with the key itself) do not wipe
/// themselves, so they live in one of these.
struct Wiped<T>(NonNull<T>);

// SAFETY: owns its T like a Box.
unsafe impl<T: Send> Send for Wiped<T> {}
unsafe impl<T: Sync> Sync for Wiped<T> {}

impl<T> Wiped<T> {
    fn new(value: T) -> Wiped<T> {
        Wiped(NonNull::from(Box::leak(Box::new(value))))
    }
}

impl<T> std::ops::Deref for Wiped<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: a live value owned by self.
        unsafe { self.0.as_ref() }
    }
}

impl<T> Drop for Wiped<T> {
    fn drop(&mut self) {
        let ptr = self.0.as_ptr();
        // SAFETY: the value is dropped once, then its memory (still
        // allocated) is overwritten as plain bytes and freed through a Box of
        // the same layout that drops nothing.
        unsafe {
            std::ptr::drop_in_place(ptr);
            wipe(std::slice::from_raw_parts_mut(
                ptr as *mut u8,
                std::mem::size_of::<T>(),
            ));
            drop(Box::from_raw(ptr as *mut MaybeUninit<T>));
        }
    }
}

/// A tenant's sealing keys, ready for use by every worker.
pub(crate) struct Sealer {
    payload: Wiped<LessSafeKey>,
    key_field: Wiped<LessSafeKey>,
    names: Wiped<hmac::Key>,
    random: SystemRandom,
}

/// What a sealed record says once its key field opened under this tier's key.
pub(crate) struct OpenedRecord {
    key: [u8; crate::key::MAX_KEY_LEN],
    key_len: usize,
    pub nonce: Nonce,
}

impl OpenedRecord {
    pub(crate) fn key(&self) -> &[u8] {
        &self.key[..self.key_len]
    }
}

impl Drop for OpenedRecord {
    fn drop(&mut self) {
        wipe(&mut self.key);
    }
}

fn aead_key(secret: &[u8]) -> Wiped<LessSafeKey> {
    let unbound = UnboundKey::new(&aead::AES_256_GCM, secret).expect("a 32-byte key");
    Wiped::new(LessSafeKey::new(unbound))
}

fn auth_failed() -> String {
    "does not authenticate under this tier's seal key".into()
}

impl Sealer {
    pub(crate) fn new(key: &SealKey) -> Sealer {
        let master = Wiped::new(hmac::Key::new(hmac::HMAC_SHA256, key.bytes()));
        let derive = |label: &[u8]| {
            let mut sub = [0u8; 32];
            sub.copy_from_slice(hmac::sign(&master, label).as_ref());
            sub
        };
        let mut payload = derive(b"kvtier seal v1: payload");
        let mut key_field = derive(b"kvtier seal v1: key field");
        let mut names = derive(b"kvtier seal v1: names");
        let sealer = Sealer {
            payload: aead_key(&payload),
            key_field: aead_key(&key_field),
            names: Wiped::new(hmac::Key::new(hmac::HMAC_SHA256, &names)),
            random: SystemRandom::new(),
        };
        for sub in [&mut payload, &mut key_field, &mut names] {
            wipe(sub);
        }
        sealer
    }

    /// The storage name of a block: a PRF of namespace, block size and key,
    /// which nobody without the seal key can compute or invert.
    pub(crate) fn name_tag(&self, namespace_fp: u64, block_bytes: usize, key: &[u8]) -> NameTag {
        let mut ctx = hmac::Context::with_key(&self.names);
        ctx.update(&namespace_fp.to_le_bytes());
        ctx.update(&(block_bytes as u64).to_le_bytes());
        ctx.update(&[key.len() as u8]);
        ctx.update(key);
        let mut tag = [0u8; NAME_TAG_LEN];
        tag.copy_from_slice(&ctx.sign().as_ref()[..NAME_TAG_LEN]);
        tag
    }

    /// The tenant's mark on what it keeps beside its blocks in shared storage
    /// (its clear generation): the name tag of the empty key, which no block
    /// has, so it says nothing to whoever lacks the seal key.
    pub(crate) fn tenant_tag(&self, namespace_fp: u64, block_bytes: usize) -> NameTag {
        self.name_tag(namespace_fp, block_bytes, &[])
    }

    /// Encrypts `payload` in place for `key` under a fresh nonce and writes
    /// the record that opens it into `out[..RECORD_LEN]`.
    pub(crate) fn seal(
        &self,
        namespace_fp: u64,
        key: &[u8],
        payload: &mut [u8],
        out: &mut [u8],
    ) -> Result<Nonce> {
        let record = &mut out[..RECORD_LEN];
        let mut nonce = [0u8; record::NONCE_LEN];
        if self.random.fill(&mut nonce).is_err() {
            return Err(Error::new(
                ErrorKind::Io,
                "seal: the system random number generator failed",
            ));
        }
        record::write_binding(record, namespace_fp, payload.len(), &nonce);
        let mut field = [0u8; KEY_FIELD_LEN];
        field[0] = key.len() as u8;
        field[1..1 + key.len()].copy_from_slice(key);
        let binding: [u8; BINDING_LEN] = record[..BINDING_LEN].try_into().expect("binding");
        let key_tag = self
            .key_field
            .seal_in_place_separate_tag(
                aead::Nonce::assume_unique_for_key(nonce),
                Aad::from(&binding),
                &mut field,
            )
            .expect("a key field within AES-GCM's length limit");
        let (aad, aad_len) = payload_aad(&binding, key);
        let payload_tag = self
            .payload
            .seal_in_place_separate_tag(
                aead::Nonce::assume_unique_for_key(nonce),
                Aad::from(&aad[..aad_len]),
                payload,
            )
            .map_err(|_| Error::new(ErrorKind::InvalidArg, "seal: block too large for AES-GCM"))?;
        record[PAYLOAD_TAG_AT..PAYLOAD_TAG_AT + TAG_LEN].copy_from_slice(payload_tag.as_ref());
        record[KEY_FIELD_AT..KEY_TAG_AT].copy_from_slice(&field);
        record[KEY_TAG_AT..RECORD_LEN].copy_from_slice(key_tag.as_ref());
        Ok(nonce)
    }

    /// Checks a record's plain fields and opens its key field: the block's
    /// key and nonce, or what is wrong (under another tenant's key the key
    /// field does not open). A record of a newer format whose key field
    /// opens is told apart first (its error starts with `NEWER`).
    pub(crate) fn open_record(
        &self,
        namespace_fp: u64,
        block_bytes: usize,
        record: &[u8],
    ) -> std::result::Result<OpenedRecord, String> {
        if let Some(problem) = self.newer_problem(record) {
            return Err(problem);
        }
        let nonce = record::check_binding(record, namespace_fp, block_bytes)?;
        let Some(mut field) = self.open_key_field(record) else {
            return Err(format!("key field {}", auth_failed()));
        };
        let mut out = OpenedRecord {
            key: [0; crate::key::MAX_KEY_LEN],
            key_len: field[0] as usize,
            nonce,
        };
        let good = (1..=crate::key::MAX_KEY_LEN).contains(&out.key_len);
        out.key.copy_from_slice(&field[1..]);
        wipe(&mut field);
        if !good {
            return Err(format!("key field {}", auth_failed()));
        }
        Ok(out)
    }

    /// [`open_record`](Self::open_record)'s error for a record of a newer
    /// format than this build reads, if `record` is one: this magic, a
    /// higher version, and a key field that opens under this tenant's key
    /// with the record's own binding (so the version is the writer's, not
    /// a damaged byte). For a reader that must tell before it looks at
    /// anything else (a value's length).
    pub(crate) fn newer_problem(&self, record: &[u8]) -> Option<String> {
        let version = record::claims_newer(record)?;
        let mut field = self.open_key_field(record)?;
        wipe(&mut field);
        Some(format!(
            "{NEWER}sealed format version {version}, this build reads {FORMAT_VERSION}"
        ))
    }

    /// The key field of `record` (length byte and key), opened under the
    /// key-field subkey with the record's binding as additional data; None
    /// if it does not authenticate or the record is too short. The caller
    /// wipes what it gets.
    fn open_key_field(&self, record: &[u8]) -> Option<[u8; KEY_FIELD_LEN]> {
        if record.len() < RECORD_LEN {
            return None;
        }
        let binding: [u8; BINDING_LEN] = record[..BINDING_LEN].try_into().expect("binding");
        let nonce: record::Nonce = record[32..BINDING_LEN].try_into().expect("nonce");
        let mut field: [u8; KEY_FIELD_LEN] = record[KEY_FIELD_AT..KEY_TAG_AT]
            .try_into()
            .expect("key field");
        let tag: [u8; TAG_LEN] = record[KEY_TAG_AT..RECORD_LEN].try_into().expect("tag");
        let opened = self
            .key_field
            .open_in_place_separate_tag(
                aead::Nonce::assume_unique_for_key(nonce),
                Aad::from(&binding),
                aead::Tag::from(tag),
                &mut field,
                0..,
            )
            .is_ok();
        if !opened {
            wipe(&mut field);
            return None;
        }
        Some(field)
    }

    /// Decrypts a sealed payload in place, after checking its tag. On
    /// failure the bytes of `payload` are unspecified.
    pub(crate) fn open_payload(
        &self,
        record: &[u8],
        opened: &OpenedRecord,
        payload: &mut [u8],
    ) -> std::result::Result<(), String> {
        let binding: [u8; BINDING_LEN] = record[..BINDING_LEN].try_into().expect("binding");
        let tag: [u8; TAG_LEN] = record[PAYLOAD_TAG_AT..PAYLOAD_TAG_AT + TAG_LEN]
            .try_into()
            .expect("tag");
        let (aad, aad_len) = payload_aad(&binding, opened.key());
        self.payload
            .open_in_place_separate_tag(
                aead::Nonce::assume_unique_for_key(opened.nonce),
                Aad::from(&aad[..aad_len]),
                aead::Tag::from(tag),
                payload,
                0..,
            )
            .map(drop)
            .map_err(|_| format!("payload {}", auth_failed()))
    }
}

/// The payload's additional data: binding, key length, key.
fn payload_aad(binding: &[u8; BINDING_LEN], key: &[u8]) -> ([u8; MAX_PAYLOAD_AAD], usize) {
    let mut aad = [0u8; MAX_PAYLOAD_AAD];
    aad[..BINDING_LEN].copy_from_slice(binding);
    aad[BINDING_LEN] = key.len() as u8;
    aad[BINDING_LEN + 1..BINDING_LEN + 1 + key.len()].copy_from_slice(key);
    (aad, BINDING_LEN + 1 + key.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealer(byte: u8) -> Sealer {
        Sealer::new(&SealKey::from_hex("k", &format!("{byte:02x}").repeat(32)).unwrap())
    }

    fn sealed(s: &Sealer, key: &[u8], plain: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let mut payload = plain.to_vec();
        let mut record = vec![0u8; RECORD_LEN];
        s.seal(7, key, &mut payload, &mut record).unwrap();
        (record, payload)
    }

    fn open(s: &Sealer, record: &[u8], payload: &mut [u8]) -> std::result::Result<Vec<u8>, String> {
        let opened = s.open_record(7, payload.len(), record)?;
        s.open_payload(record, &opened, payload)?;
        Ok(opened.key().to_vec())
    }

    #[test]
    fn round_trips_and_hides_key_and_payload() {
        let s = sealer(1);
        let plain: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        let (record, mut payload) = sealed(&s, b"the-block-key", &plain);
        assert_ne!(payload, plain);
        assert!(!record.windows(13).any(|w| w == b"the-block-key"));
        assert_eq!(open(&s, &record, &mut payload).unwrap(), b"the-block-key");
        assert_eq!(payload, plain);
    }

    #[test]
    fn every_flipped_byte_and_a_foreign_key_fail() {
        let s = sealer(1);
        let plain = vec![5u8; 256];
        let (record, payload) = sealed(&s, b"k", &plain);
        for at in 0..RECORD_LEN {
            let mut bad = record.clone();
            bad[at] ^= 0x20;
            assert!(
                open(&s, &bad, &mut payload.clone()).is_err(),
                "record byte {at}"
            );
        }
        for at in [0, 100, 255] {
            let mut bad = payload.clone();
            bad[at] ^= 1;
            assert!(open(&s, &record, &mut bad).is_err(), "payload byte {at}");
        }
        let err = open(&sealer(2), &record, &mut payload.clone()).unwrap_err();
        assert!(err.contains("does not authenticate"), "{err}");
        // Same key, size and namespace: the payload of one block does not open
        // with the record of another.
        let (other, _) = sealed(&s, b"k", &plain);
        assert!(open(&s, &other, &mut payload.clone()).is_err());
    }

    /// `record` rewritten as the next sealed format would write it: the
    /// version raised and the key field sealed again over that binding.
    fn as_newer(s: &Sealer, record: &[u8]) -> Vec<u8> {
        let mut newer = record.to_vec();
        let mut field = s.open_key_field(record).expect("a record of this tenant");
        newer[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        let binding: [u8; BINDING_LEN] = newer[..BINDING_LEN].try_into().unwrap();
        let nonce: Nonce = newer[32..BINDING_LEN].try_into().unwrap();
        let tag = s
            .key_field
            .seal_in_place_separate_tag(
                aead::Nonce::assume_unique_for_key(nonce),
                Aad::from(&binding),
                &mut field,
            )
            .unwrap();
        newer[KEY_FIELD_AT..KEY_TAG_AT].copy_from_slice(&field);
        newer[KEY_TAG_AT..RECORD_LEN].copy_from_slice(tag.as_ref());
        newer
    }

    #[test]
    fn a_newer_version_is_proved_by_its_key_field_a_damaged_one_is_not() {
        let s = sealer(1);
        let (record, payload) = sealed(&s, b"k", &[5u8; 256]);
        assert_eq!(s.newer_problem(&record), None);
        let newer = as_newer(&s, &record);
        for r in [&newer[..], &{
            // A longer record of the newer format: its key field still opens.
            let mut longer = newer.clone();
            longer.extend_from_slice(&[0; 64]);
            longer
        }] {
            let problem = s.newer_problem(r).expect("a newer record");
            assert!(problem.starts_with(NEWER) && problem.contains("version 2"));
            let err = open(&s, r, &mut payload.clone()).unwrap_err();
            assert!(err.starts_with(NEWER), "{err}");
        }
        // The version byte flipped alone (no writer's seal over it): damage.
        for version in [2u32, 0x7f, 0x0100_0001] {
            let mut damaged = record.clone();
            damaged[8..12].copy_from_slice(&version.to_le_bytes());
            assert_eq!(s.newer_problem(&damaged), None, "version {version}");
            let err = open(&s, &damaged, &mut payload.clone()).unwrap_err();
            assert!(!err.starts_with(NEWER), "version {version}: {err}");
        }
        // Another tenant cannot prove it newer either: for it, damage.
        assert_eq!(sealer(2).newer_problem(&newer), None);
        assert!(!open(&sealer(2), &newer, &mut payload.clone())
            .unwrap_err()
            .starts_with(NEWER));
    }

    #[test]
    fn names_depend_on_key_namespace_size_and_seal() {
        let (a, b) = (sealer(1), sealer(2));
        let n = a.name_tag(1, 4096, b"k");
        assert_eq!(n, a.name_tag(1, 4096, b"k"));
        assert_ne!(n, a.name_tag(1, 4096, b"l"));
        assert_ne!(n, a.name_tag(2, 4096, b"k"));
        assert_ne!(n, a.name_tag(1, 8192, b"k"));
        assert_ne!(n, b.name_tag(1, 4096, b"k"));
    }
}
