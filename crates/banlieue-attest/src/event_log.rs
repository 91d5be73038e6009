//! The firmware's event log (TCG PC Client Platform Firmware Profile, "crypto agile" format:
//! the log a UEFI firmware hands the kernel, which Linux shows as
//! `/sys/kernel/security/tpm0/binary_bios_measurements`), parsed strictly and replayed.
//!
//! The log says *what* was measured into each PCR (the firmware's volumes, the boot
//! variables, the GPT, each EFI application, Secure Boot's state); the quote says what the
//! PCRs *are*. The log proves nothing by itself, since anyone can write one: it is believed
//! only where replaying its SHA-256 digests gives exactly the values the quote signed. So a
//! relay may carry it without being trusted, and a log that was altered, cut or padded fails
//! the replay.

use sha2::{Digest, Sha256};

use crate::public::{ALG_SHA256, Reader};

/// The largest log accepted (OVMF with shim and GRUB writes a few tens of KiB).
pub const MAX_EVENT_LOG_BYTES: usize = 128 * 1024;
/// The most events, digests per event and algorithms in the log's header accepted.
const MAX_EVENTS: usize = 4096;
const MAX_ALGORITHMS: u32 = 8;
/// PCRs 0-23: what a PC Client TPM has.
const PCR_COUNT: u32 = 24;

/// An event that is recorded but never extended into a PCR.
pub const EV_NO_ACTION: u32 = 0x3;
const SPEC_ID_SIGNATURE: &[u8; 16] = b"Spec ID Event03\0";
const STARTUP_LOCALITY_SIGNATURE: &[u8; 16] = b"StartupLocality\0";

/// Why a log was refused, or did not replay to the quoted values.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EventLogError {
    #[error("the event log is {0} bytes, over the {MAX_EVENT_LOG_BYTES} accepted")]
    TooLarge(usize),
    #[error("the event log has over {MAX_EVENTS} events")]
    TooManyEvents,
    #[error(
        "the event log does not begin with a Spec ID Event03 header (not the crypto-agile format of a TPM 2.0 firmware)"
    )]
    NotCryptoAgile,
    #[error("the event log records no SHA-256 digests")]
    NoSha256,
    #[error("event {index}: {why}")]
    Event { index: usize, why: String },
    #[error("the event log is malformed: {0}")]
    Malformed(crate::Error),
    #[error(
        "PCR {pcr}: the event log replays to {replayed}, the quote signed {quoted}: the log is not the one this boot measured"
    )]
    Mismatch {
        pcr: u32,
        replayed: String,
        quoted: String,
    },
}

impl From<crate::Error> for EventLogError {
    fn from(e: crate::Error) -> Self {
        EventLogError::Malformed(e)
    }
}

/// One measurement: into which PCR, of what kind, its SHA-256 digest (absent only for
/// events that extend nothing) and the firmware's description of what was measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub pcr: u32,
    pub event_type: u32,
    pub sha256: Option<[u8; 32]>,
    pub data: Vec<u8>,
}

impl Event {
    /// The event type's name in the PC Client profile, for people reading a verification.
    pub fn type_name(&self) -> &'static str {
        match self.event_type {
            0x0 => "EV_PREBOOT_CERT",
            0x1 => "EV_POST_CODE",
            0x3 => "EV_NO_ACTION",
            0x4 => "EV_SEPARATOR",
            0x5 => "EV_ACTION",
            0x6 => "EV_EVENT_TAG",
            0x7 => "EV_S_CRTM_CONTENTS",
            0x8 => "EV_S_CRTM_VERSION",
            0x9 => "EV_CPU_MICROCODE",
            0xa => "EV_PLATFORM_CONFIG_FLAGS",
            0xb => "EV_TABLE_OF_DEVICES",
            0xc => "EV_COMPACT_HASH",
            0xd => "EV_IPL",
            0xe => "EV_IPL_PARTITION_DATA",
            0xf => "EV_NONHOST_CODE",
            0x10 => "EV_NONHOST_CONFIG",
            0x11 => "EV_NONHOST_INFO",
            0x12 => "EV_OMIT_BOOT_DEVICE_EVENTS",
            0x8000_0001 => "EV_EFI_VARIABLE_DRIVER_CONFIG",
            0x8000_0002 => "EV_EFI_VARIABLE_BOOT",
            0x8000_0003 => "EV_EFI_BOOT_SERVICES_APPLICATION",
            0x8000_0004 => "EV_EFI_BOOT_SERVICES_DRIVER",
            0x8000_0005 => "EV_EFI_RUNTIME_SERVICES_DRIVER",
            0x8000_0006 => "EV_EFI_GPT_EVENT",
            0x8000_0007 => "EV_EFI_ACTION",
            0x8000_0008 => "EV_EFI_PLATFORM_FIRMWARE_BLOB",
            0x8000_0009 => "EV_EFI_HANDOFF_TABLES",
            0x8000_000a => "EV_EFI_PLATFORM_FIRMWARE_BLOB2",
            0x8000_000b => "EV_EFI_HANDOFF_TABLES2",
            0x8000_000c => "EV_EFI_VARIABLE_BOOT2",
            0x8000_00e0 => "EV_EFI_VARIABLE_AUTHORITY",
            _ => "an event type of no name here",
        }
    }
}

/// A parsed log: its events in order, and the PCR 0 locality the firmware started from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventLog {
    pub events: Vec<Event>,
    startup_locality: u8,
}

impl EventLog {
    /// Parses a crypto-agile log: the Spec ID header event in the SHA-1 form, then events
    /// each carrying a digest for every algorithm the header lists.
    pub fn parse(bytes: &[u8]) -> Result<Self, EventLogError> {
        if bytes.len() > MAX_EVENT_LOG_BYTES {
            return Err(EventLogError::TooLarge(bytes.len()));
        }
        let mut r = Reader::new(bytes, "the event log");
        let digest_sizes = spec_id_header(&mut r)?;
        let mut events = Vec::new();
        let mut startup_locality = 0;
        while !r.is_empty() {
            if events.len() == MAX_EVENTS {
                return Err(EventLogError::TooManyEvents);
            }
            let index = events.len() + 1;
            let event =
                event2(&mut r, &digest_sizes).map_err(|why| EventLogError::Event { index, why })?;
            if event.event_type == EV_NO_ACTION
                && event.pcr == 0
                && event.data.len() == 17
                && event.data.starts_with(STARTUP_LOCALITY_SIGNATURE)
            {
                startup_locality = event.data[16];
            }
            events.push(event);
        }
        Ok(EventLog {
            events,
            startup_locality,
        })
    }

    /// Every PCR's SHA-256 value as this log says it must be: each starts at zeros (PCR 0
    /// at the startup locality, when the firmware recorded one) and is extended with each of
    /// its events' digests in order.
    pub fn replay_sha256(&self) -> Vec<[u8; 32]> {
        let mut pcrs = vec![[0u8; 32]; PCR_COUNT as usize];
        pcrs[0][31] = self.startup_locality;
        for event in &self.events {
            let Some(digest) = &event.sha256 else {
                continue;
            };
            let pcr = &mut pcrs[event.pcr as usize];
            let mut h = Sha256::new();
            h.update(*pcr);
            h.update(digest);
            *pcr = h.finalize().into();
        }
        pcrs
    }

    /// Checks the replay against quoted SHA-256 values: `quoted` holds `(pcr, value)` pairs,
    /// as the quote's selection lists them.
    pub fn check(&self, quoted: &[(u32, &[u8])]) -> Result<(), EventLogError> {
        let replayed = self.replay_sha256();
        for (pcr, value) in quoted {
            let Some(expected) = replayed.get(*pcr as usize) else {
                return Err(EventLogError::Mismatch {
                    pcr: *pcr,
                    replayed: "nothing (no such PCR)".into(),
                    quoted: crate::quote::hex(value),
                });
            };
            if expected.as_slice() != *value {
                return Err(EventLogError::Mismatch {
                    pcr: *pcr,
                    replayed: crate::quote::hex(expected),
                    quoted: crate::quote::hex(value),
                });
            }
        }
        Ok(())
    }

    /// How many events measured into `pcr`.
    pub fn events_in(&self, pcr: u32) -> usize {
        self.events
            .iter()
            .filter(|e| e.pcr == pcr && e.sha256.is_some())
            .count()
    }
}

/// The first event, in the SHA-1 form: EV_NO_ACTION into PCR 0 with a zero digest, carrying
/// the Spec ID Event03 structure that lists each algorithm's digest size.
fn spec_id_header(r: &mut Reader<'_>) -> Result<Vec<(u16, u16)>, EventLogError> {
    let pcr = r.u32_le()?;
    let event_type = r.u32_le()?;
    let _sha1 = r.take(20)?;
    let size = r.u32_le()? as usize;
    let data = r.take(size)?;
    if pcr != 0 || event_type != EV_NO_ACTION || !data.starts_with(SPEC_ID_SIGNATURE) {
        return Err(EventLogError::NotCryptoAgile);
    }
    let mut d = Reader::new(&data[16..], "the Spec ID event");
    let _platform_class = d.u32_le()?;
    let _version_and_uintn = d.take(4)?;
    let count = d.u32_le()?;
    if count == 0 || count > MAX_ALGORITHMS {
        return Err(EventLogError::Malformed(crate::Error::Unsupported {
            what: "the Spec ID event",
            why: format!("{count} algorithms"),
        }));
    }
    let mut sizes = Vec::new();
    for _ in 0..count {
        let algorithm = d.u16_le()?;
        let size = d.u16_le()?;
        if size == 0 || size > 64 {
            return Err(EventLogError::Malformed(crate::Error::Unsupported {
                what: "the Spec ID event",
                why: format!("a digest of {size} bytes"),
            }));
        }
        sizes.push((algorithm, size));
    }
    let vendor = d.take(1)?[0];
    d.take(usize::from(vendor))?;
    d.end()?;
    if !sizes.iter().any(|(algorithm, _)| *algorithm == ALG_SHA256) {
        return Err(EventLogError::NoSha256);
    }
    Ok(sizes)
}

/// One TCG_PCR_EVENT2: its PCR, type, a digest per algorithm of the header, and its data.
fn event2(r: &mut Reader<'_>, digest_sizes: &[(u16, u16)]) -> Result<Event, String> {
    let pcr = r.u32_le().map_err(|e| e.to_string())?;
    if pcr >= PCR_COUNT {
        return Err(format!("PCR {pcr}, not one of 0-{}", PCR_COUNT - 1));
    }
    let event_type = r.u32_le().map_err(|e| e.to_string())?;
    let count = r.u32_le().map_err(|e| e.to_string())?;
    if count > MAX_ALGORITHMS {
        return Err(format!("{count} digests"));
    }
    let mut sha256 = None;
    for _ in 0..count {
        let algorithm = r.u16_le().map_err(|e| e.to_string())?;
        let Some((_, size)) = digest_sizes.iter().find(|(a, _)| *a == algorithm) else {
            return Err(format!(
                "a digest of algorithm {algorithm:#06x}, which the header does not list"
            ));
        };
        let digest = r.take(usize::from(*size)).map_err(|e| e.to_string())?;
        if algorithm == ALG_SHA256 {
            sha256 = Some(digest.try_into().map_err(|_| "a short SHA-256 digest")?);
        }
    }
    let size = r.u32_le().map_err(|e| e.to_string())? as usize;
    let data = r.take(size).map_err(|e| e.to_string())?.to_vec();
    if event_type == EV_NO_ACTION {
        // Recorded, never extended, whatever digest it carries.
        sha256 = None;
    } else if sha256.is_none() {
        return Err(format!(
            "{} into PCR {pcr} without a SHA-256 digest",
            Event {
                pcr,
                event_type,
                sha256: None,
                data: Vec::new()
            }
            .type_name()
        ));
    }
    Ok(Event {
        pcr,
        event_type,
        sha256,
        data,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const ALG_SHA1: u16 = 0x0004;

    /// A crypto-agile log of SHA-1 and SHA-256 banks holding `events` (`pcr`, type, data),
    /// each digest the hash of its data, as firmware would write it.
    pub(crate) fn log(events: &[(u32, u32, &[u8])]) -> Vec<u8> {
        let mut spec = SPEC_ID_SIGNATURE.to_vec();
        spec.extend_from_slice(&0u32.to_le_bytes());
        spec.extend_from_slice(&[0, 2, 0, 2]);
        spec.extend_from_slice(&2u32.to_le_bytes());
        for (algorithm, size) in [(ALG_SHA1, 20u16), (ALG_SHA256, 32)] {
            spec.extend_from_slice(&algorithm.to_le_bytes());
            spec.extend_from_slice(&size.to_le_bytes());
        }
        spec.push(0);
        let mut out = Vec::new();
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&EV_NO_ACTION.to_le_bytes());
        out.extend_from_slice(&[0; 20]);
        out.extend_from_slice(&(spec.len() as u32).to_le_bytes());
        out.extend_from_slice(&spec);
        for (pcr, event_type, data) in events {
            out.extend_from_slice(&pcr.to_le_bytes());
            out.extend_from_slice(&event_type.to_le_bytes());
            out.extend_from_slice(&2u32.to_le_bytes());
            out.extend_from_slice(&ALG_SHA1.to_le_bytes());
            out.extend_from_slice(&[0x11; 20]);
            out.extend_from_slice(&ALG_SHA256.to_le_bytes());
            out.extend_from_slice(&Sha256::digest(data));
            out.extend_from_slice(&(data.len() as u32).to_le_bytes());
            out.extend_from_slice(data);
        }
        out
    }

    fn extend(pcr: [u8; 32], data: &[u8]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(pcr);
        h.update(Sha256::digest(data));
        h.finalize().into()
    }

    #[test]
    fn replays_each_pcr_from_its_own_events_in_order() {
        let bytes = log(&[
            (0, 0x8000_0008, b"firmware volume"),
            (4, 0x8000_0007, b"Calling EFI Application from Boot Option"),
            (0, EV_NO_ACTION, b"never extended"),
            (4, 0x8000_0003, b"shim"),
            (7, 0x4, &[0; 4]),
        ]);
        let parsed = EventLog::parse(&bytes).unwrap();
        assert_eq!(parsed.events.len(), 5);
        assert_eq!(parsed.events[1].type_name(), "EV_EFI_ACTION");
        let pcrs = parsed.replay_sha256();
        assert_eq!(pcrs[0], extend([0; 32], b"firmware volume"));
        let pcr4 = extend(
            extend([0; 32], b"Calling EFI Application from Boot Option"),
            b"shim",
        );
        assert_eq!(pcrs[4], pcr4);
        assert_eq!(pcrs[7], extend([0; 32], &[0; 4]));
        assert_eq!(pcrs[1], [0; 32]);
        assert_eq!(parsed.events_in(0), 1);

        parsed.check(&[(0, &pcrs[0]), (4, &pcr4)]).unwrap();
        let err = parsed.check(&[(4, &pcrs[0])]).unwrap_err();
        assert!(
            matches!(err, EventLogError::Mismatch { pcr: 4, .. }),
            "{err}"
        );
    }

    #[test]
    fn a_startup_locality_event_starts_pcr_0_there() {
        let mut locality = STARTUP_LOCALITY_SIGNATURE.to_vec();
        locality.push(3);
        let bytes = log(&[(0, EV_NO_ACTION, &locality), (0, 0x8, b"crtm")]);
        let pcrs = EventLog::parse(&bytes).unwrap().replay_sha256();
        let mut start = [0; 32];
        start[31] = 3;
        assert_eq!(pcrs[0], extend(start, b"crtm"));
    }

    #[test]
    fn refuses_what_is_not_a_whole_crypto_agile_log() {
        let bytes = log(&[(4, 0x8000_0003, b"shim")]);
        // Cut anywhere inside the last event.
        for cut in [bytes.len() - 1, bytes.len() - 5, bytes.len() - 40] {
            let err = EventLog::parse(&bytes[..cut]).unwrap_err();
            assert!(
                matches!(err, EventLogError::Event { index: 1, .. }),
                "{err}"
            );
        }
        // A TPM 1.2 (SHA-1 only) log: no Spec ID header.
        let mut legacy = bytes.clone();
        legacy[32] = b'X';
        assert_eq!(
            EventLog::parse(&legacy).unwrap_err(),
            EventLogError::NotCryptoAgile
        );
        // A PCR out of range, and an unlisted algorithm.
        let header = bytes.len() - (4 + 4 + 4 + 2 + 20 + 2 + 32 + 4 + 4);
        let mut far = bytes.clone();
        far[header..header + 4].copy_from_slice(&24u32.to_le_bytes());
        assert!(
            EventLog::parse(&far)
                .unwrap_err()
                .to_string()
                .contains("PCR 24")
        );
        let mut unlisted = bytes.clone();
        unlisted[header + 12..header + 14].copy_from_slice(&0x000cu16.to_le_bytes());
        let err = EventLog::parse(&unlisted).unwrap_err().to_string();
        assert!(err.contains("does not list"), "{err}");
        assert_eq!(
            EventLog::parse(&vec![0; MAX_EVENT_LOG_BYTES + 1]).unwrap_err(),
            EventLogError::TooLarge(MAX_EVENT_LOG_BYTES + 1)
        );
    }

    #[test]
    fn refuses_a_log_without_sha256() {
        let mut bytes = log(&[]);
        // The header's second algorithm, SHA-256, made SHA-384's id.
        let at = 32 + 16 + 4 + 4 + 4 + 4;
        assert_eq!(&bytes[at..at + 2], &ALG_SHA256.to_le_bytes());
        bytes[at..at + 2].copy_from_slice(&0x000cu16.to_le_bytes());
        assert_eq!(
            EventLog::parse(&bytes).unwrap_err(),
            EventLogError::NoSha256
        );
    }
}
