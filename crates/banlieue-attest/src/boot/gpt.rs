//! A disk's GUID partition table, read as a UEFI firmware reads it before booting from the
//! disk, and the `EV_EFI_GPT_EVENT` it measures into PCR 5 (`UEFI_GPT_DATA`: the primary
//! header, the number of partitions in use, and each used entry in table order).

use super::{BootError, Disk, SECTOR};

/// The partition type of an EFI system partition.
pub const ESP_TYPE: [u8; 16] = guid_bytes(
    0xC12A7328,
    0xF81F,
    0x11D2,
    [0xBA, 0x4B, 0x00, 0xA0, 0xC9, 0x3E, 0xC9, 0x3B],
);

/// `EFI_PARTITION_TABLE_HEADER`'s size: what the firmware copies into the event, whatever
/// HeaderSize says.
const HEADER_BYTES: usize = 92;
/// Bounds on the entry array (the specification's minimum table is 128 entries of 128 bytes).
const MAX_ENTRIES: u32 = 1024;
const MAX_ENTRY_BYTES: u32 = 1024;

/// One used partition entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub type_guid: [u8; 16],
    pub first_lba: u64,
    pub last_lba: u64,
}

/// The primary partition table, its checksums verified.
#[derive(Debug)]
pub struct PartitionTable {
    header: Vec<u8>,
    /// Each used entry's bytes (`SizeOfPartitionEntry` of them), in table order.
    used: Vec<Vec<u8>>,
    pub partitions: Vec<Partition>,
}

impl PartitionTable {
    /// Reads the primary header at LBA 1 and its entry array; both CRC32s must hold, as the
    /// firmware requires before it measures (or boots from) the table.
    pub fn read(disk: &dyn Disk) -> Result<Self, BootError> {
        let mut header = vec![0u8; SECTOR];
        disk.read_at(SECTOR as u64, &mut header)?;
        if &header[..8] != b"EFI PART" {
            return Err(BootError::Gpt("no GPT header at LBA 1".into()));
        }
        let header_size = u32_le(&header, 12) as usize;
        if !(HEADER_BYTES..=SECTOR).contains(&header_size) {
            return Err(BootError::Gpt(format!("HeaderSize {header_size}")));
        }
        let mut zeroed = header[..header_size].to_vec();
        zeroed[16..20].fill(0);
        if crc32fast::hash(&zeroed) != u32_le(&header, 16) {
            return Err(BootError::Gpt("the header's CRC32 does not match".into()));
        }
        let entries_lba = u64_le(&header, 72);
        let count = u32_le(&header, 80);
        let entry_size = u32_le(&header, 84);
        if count > MAX_ENTRIES
            || !(128..=MAX_ENTRY_BYTES).contains(&entry_size)
            || !entry_size.is_multiple_of(128)
        {
            return Err(BootError::Gpt(format!(
                "{count} entries of {entry_size} bytes (at most {MAX_ENTRIES} of 128 to {MAX_ENTRY_BYTES}, a multiple of 128)"
            )));
        }
        let offset = entries_lba
            .checked_mul(SECTOR as u64)
            .ok_or_else(|| BootError::Gpt(format!("PartitionEntryLBA {entries_lba}")))?;
        let mut entries = vec![0u8; count as usize * entry_size as usize];
        disk.read_at(offset, &mut entries)?;
        if crc32fast::hash(&entries) != u32_le(&header, 88) {
            return Err(BootError::Gpt(
                "the entry array's CRC32 does not match".into(),
            ));
        }
        let mut used = Vec::new();
        let mut partitions = Vec::new();
        for entry in entries.chunks_exact(entry_size as usize) {
            let type_guid: [u8; 16] = entry[..16].try_into().expect("16 bytes");
            if type_guid == [0; 16] {
                continue;
            }
            partitions.push(Partition {
                type_guid,
                first_lba: u64_le(entry, 32),
                last_lba: u64_le(entry, 40),
            });
            used.push(entry.to_vec());
        }
        header.truncate(HEADER_BYTES);
        Ok(PartitionTable {
            header,
            used,
            partitions,
        })
    }

    /// The `UEFI_GPT_DATA` the firmware measures: the header's 92 bytes, the count of used
    /// entries as a UINT64, then those entries.
    pub fn gpt_event(&self) -> Vec<u8> {
        let mut event = self.header.clone();
        event.extend_from_slice(&(self.used.len() as u64).to_le_bytes());
        for entry in &self.used {
            event.extend_from_slice(entry);
        }
        event
    }

    /// The first EFI system partition: (byte offset, byte length).
    pub fn esp(&self) -> Result<(u64, u64), BootError> {
        let esp = self
            .partitions
            .iter()
            .find(|p| p.type_guid == ESP_TYPE)
            .ok_or(BootError::NoEsp)?;
        if esp.last_lba < esp.first_lba {
            return Err(BootError::Gpt("the ESP ends before it begins".into()));
        }
        let length = (esp.last_lba - esp.first_lba + 1).saturating_mul(SECTOR as u64);
        Ok((esp.first_lba.saturating_mul(SECTOR as u64), length))
    }
}

/// A GUID as the GPT stores it: the first three fields little-endian.
const fn guid_bytes(a: u32, b: u16, c: u16, d: [u8; 8]) -> [u8; 16] {
    let a = a.to_le_bytes();
    let b = b.to_le_bytes();
    let c = c.to_le_bytes();
    [
        a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d[0], d[1], d[2], d[3], d[4], d[5], d[6],
        d[7],
    ]
}

pub(super) fn u32_le(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

pub(super) fn u64_le(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A disk of `sectors` sectors with a GPT of 128 entries, `partitions` used.
    pub fn disk(sectors: u64, partitions: &[([u8; 16], u64, u64)]) -> Vec<u8> {
        let mut disk = vec![0u8; sectors as usize * SECTOR];
        let mut entries = vec![0u8; 128 * 128];
        for (index, (type_guid, first, last)) in partitions.iter().enumerate() {
            let entry = &mut entries[index * 128..(index + 1) * 128];
            entry[..16].copy_from_slice(type_guid);
            entry[16] = index as u8 + 1;
            entry[32..40].copy_from_slice(&first.to_le_bytes());
            entry[40..48].copy_from_slice(&last.to_le_bytes());
        }
        disk[2 * SECTOR..2 * SECTOR + entries.len()].copy_from_slice(&entries);
        let header = &mut disk[SECTOR..SECTOR + HEADER_BYTES];
        header[..8].copy_from_slice(b"EFI PART");
        header[8..12].copy_from_slice(&0x10000u32.to_le_bytes());
        header[12..16].copy_from_slice(&92u32.to_le_bytes());
        header[24..32].copy_from_slice(&1u64.to_le_bytes());
        header[72..80].copy_from_slice(&2u64.to_le_bytes());
        header[80..84].copy_from_slice(&128u32.to_le_bytes());
        header[84..88].copy_from_slice(&128u32.to_le_bytes());
        header[88..92].copy_from_slice(&crc32fast::hash(&entries).to_le_bytes());
        let crc = crc32fast::hash(header);
        header[16..20].copy_from_slice(&crc.to_le_bytes());
        disk
    }

    #[test]
    fn the_event_holds_the_header_and_the_used_entries_only() {
        let disk = disk(64, &[(ESP_TYPE, 34, 40), ([9; 16], 41, 60)]);
        let table = PartitionTable::read(&disk).unwrap();
        let event = table.gpt_event();
        assert_eq!(event.len(), 92 + 8 + 2 * 128);
        assert_eq!(&event[..92], &disk[SECTOR..SECTOR + 92]);
        assert_eq!(u64_le(&event, 92), 2);
        assert_eq!(&event[100..228], &disk[2 * SECTOR..2 * SECTOR + 128]);
        assert_eq!(table.esp().unwrap(), (34 * 512, 7 * 512));
    }

    #[test]
    fn a_table_whose_checksums_fail_is_refused() {
        let mut header_changed = disk(64, &[(ESP_TYPE, 34, 40)]);
        header_changed[SECTOR + 40] ^= 1;
        assert!(matches!(
            PartitionTable::read(&header_changed),
            Err(BootError::Gpt(m)) if m.contains("header's CRC32")
        ));
        let mut entry_changed = disk(64, &[(ESP_TYPE, 34, 40)]);
        entry_changed[2 * SECTOR + 40] ^= 1;
        assert!(matches!(
            PartitionTable::read(&entry_changed),
            Err(BootError::Gpt(m)) if m.contains("entry array's CRC32")
        ));
        assert!(matches!(
            PartitionTable::read(&disk(64, &[([9; 16], 34, 40)]))
                .unwrap()
                .esp(),
            Err(BootError::NoEsp)
        ));
        assert!(matches!(
            PartitionTable::read(&vec![0u8; 4096]),
            Err(BootError::Gpt(_))
        ));
    }
}
