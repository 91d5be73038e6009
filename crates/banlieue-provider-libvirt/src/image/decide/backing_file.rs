//! BackingFile sources: only volumes the administrator declared, never a machine's own, and
//! Ready only when the volume is in the pool.

use banlieue_api::{ZoneImageStatus, ZonePhase};

/// Whether `volume` is one the Provider declared for BackingFile sources
/// (`capabilities.backingFileVolumes`: exact names, or prefixes ending in `*`).
pub fn is_declared_backing_file(volume: &str, declared: &[String]) -> bool {
    declared.iter().any(|d| match d.strip_suffix('*') {
        Some(prefix) => volume.starts_with(prefix),
        None => d == volume,
    })
}

/// Why a BackingFile source may not name a volume; [`BackingFileRefusal::message`] says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackingFileRefusal {
    /// A machine's own OS disk or seed (another guest's disk or user-data): never.
    MachineVolume(String),
    /// Not in the Provider's `capabilities.backingFileVolumes`. A LibvirtMachine may still
    /// name it if an import made it.
    Undeclared(String),
}

impl BackingFileRefusal {
    pub fn message(&self) -> &str {
        match self {
            BackingFileRefusal::MachineVolume(m) | BackingFileRefusal::Undeclared(m) => m,
        }
    }
}

/// Why a BackingFile source may not name `volume` on this Provider, or `None` when it may: a
/// machine's OS disk or seed never, any other volume only when the administrator declared it.
pub fn backing_file_refusal(
    volume: &str,
    provider: &str,
    declared: &[String],
) -> Option<BackingFileRefusal> {
    if crate::names::is_machine_volume(volume) {
        return Some(BackingFileRefusal::MachineVolume(format!(
            "volume {volume} is a machine's own disk or seed: a BackingFile can never name one"
        )));
    }
    (!is_declared_backing_file(volume, declared)).then(|| {
        BackingFileRefusal::Undeclared(format!(
            "volume {volume} is not declared for BackingFile sources on Provider {provider} \
             (spec.capabilities.backingFileVolumes)"
        ))
    })
}

/// Whether a BackingFile volume is in a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presence {
    Present,
    Absent,
    /// The pool itself is missing or the host could not be asked; the text says which.
    Unknown(String),
    /// Not looked for: the source may not name it ([`backing_file_refusal`]).
    Refused(String),
}

/// A BackingFile zone: Ready when the named volume is in the pool, otherwise Failed with the
/// guide's `volume … is not in pool` so the scheduler reports ImageNotReady.
pub fn zone_backing_file(pool: &str, volume: &str, presence: &Presence) -> ZoneImageStatus {
    let (phase, message) = match presence {
        Presence::Refused(why) => (ZonePhase::Failed, Some(why.clone())),
        Presence::Present => (ZonePhase::Ready, None),
        Presence::Absent => (
            ZonePhase::Failed,
            Some(format!(
                "volume {volume} is not in pool {pool}: a BackingFile must already be there \
                 (virsh vol-list {pool})"
            )),
        ),
        Presence::Unknown(why) => (ZonePhase::Failed, Some(why.clone())),
    };
    ZoneImageStatus {
        pool: pool.to_owned(),
        phase,
        volume: Some(volume.to_owned()),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backing_file_must_be_declared_and_never_a_machines_volume() {
        let declared = ["base.qcow2".to_owned(), "golden-*".to_owned()];
        assert_eq!(backing_file_refusal("base.qcow2", "p", &declared), None);
        assert_eq!(
            backing_file_refusal("golden-2404.raw", "p", &declared),
            None
        );
        let undeclared = backing_file_refusal("base.qcow2.bak", "p", &declared).unwrap();
        assert!(
            matches!(&undeclared, BackingFileRefusal::Undeclared(m) if m.contains("not declared")),
            "{undeclared:?}"
        );
        assert!(backing_file_refusal("golden", "p", &declared).is_some());
        // Whatever the declaration says: not another guest's disk or seed.
        let everything = ["*".to_owned()];
        for volume in ["golden-ns-vm-os.qcow2", "ns-vm-cidata.iso"] {
            let why = backing_file_refusal(volume, "p", &everything).unwrap();
            assert!(
                matches!(&why, BackingFileRefusal::MachineVolume(_))
                    && why.message().contains("a machine's own disk or seed"),
                "{why:?}"
            );
        }
        assert!(
            backing_file_refusal("any.raw", "p", &[]).is_some(),
            "nothing declared"
        );
    }

    #[test]
    fn backing_file_zone_is_ready_only_when_present() {
        assert_eq!(
            zone_backing_file("p", "base.qcow2", &Presence::Present).phase,
            ZonePhase::Ready
        );
        let absent = zone_backing_file("p", "base.qcow2", &Presence::Absent);
        assert_eq!(absent.phase, ZonePhase::Failed);
        assert!(
            absent
                .message
                .unwrap()
                .contains("volume base.qcow2 is not in pool p")
        );
    }
}
