//! Read-only FAT16/FAT32, as much as it takes to read a boot loader from an EFI system
//! partition by its path: the boot sector, directories with long names, and a file's cluster
//! chain. Every count and offset comes from the disk, so each is bounded: a chain that loops
//! or runs past the file's size, or a directory over 64 Ki entries, is refused.

use super::{BootError, Disk};

/// The largest file read (a boot loader or kernel is a few MiB).
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;
const MAX_DIRECTORY_ENTRIES: usize = 65_536;
const MAX_DEPTH: usize = 16;
const ATTR_DIRECTORY: u8 = 0x10;
const ATTR_VOLUME_ID: u8 = 0x08;
const ATTR_LONG_NAME: u8 = 0x0f;

/// A FAT file system inside a partition of a disk.
pub struct Fat<'d> {
    disk: &'d dyn Disk,
    /// The partition's first byte on the disk.
    base: u64,
    cluster_bytes: u64,
    /// Byte offset (in the partition) of the first FAT.
    fat_offset: u64,
    /// Byte offset of cluster 2.
    data_offset: u64,
    cluster_count: u32,
    fat32: bool,
    /// FAT16's fixed root directory: (offset, entries); FAT32's root is a cluster chain.
    fixed_root: Option<(u64, usize)>,
    root_cluster: u32,
}

impl std::fmt::Debug for Fat<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fat")
            .field("base", &self.base)
            .field("cluster_bytes", &self.cluster_bytes)
            .field("cluster_count", &self.cluster_count)
            .field("fat32", &self.fat32)
            .finish_non_exhaustive()
    }
}

/// A directory entry found by name.
struct Entry {
    cluster: u32,
    size: u32,
    directory: bool,
}

impl<'d> Fat<'d> {
    /// Reads the boot sector of the file system at `base` (`length` bytes) on `disk`.
    pub fn open(disk: &'d dyn Disk, base: u64, length: u64) -> Result<Self, BootError> {
        let mut boot = [0u8; 512];
        disk.read_at(base, &mut boot)?;
        if boot[510..512] != [0x55, 0xaa] {
            return Err(fat("no boot sector signature"));
        }
        let bytes_per_sector = u64::from(u16_le(&boot, 11));
        let sectors_per_cluster = u64::from(boot[13]);
        if !(512..=4096).contains(&bytes_per_sector) || !bytes_per_sector.is_power_of_two() {
            return Err(fat(&format!("{bytes_per_sector} bytes a sector")));
        }
        if sectors_per_cluster == 0 || !sectors_per_cluster.is_power_of_two() {
            return Err(fat(&format!("{sectors_per_cluster} sectors a cluster")));
        }
        let reserved = u64::from(u16_le(&boot, 14));
        let fats = u64::from(boot[16]);
        let root_entries = u64::from(u16_le(&boot, 17));
        let total = match u16_le(&boot, 19) {
            0 => u64::from(u32_le(&boot, 32)),
            small => u64::from(small),
        };
        let fat_sectors = match u16_le(&boot, 22) {
            0 => u64::from(u32_le(&boot, 36)),
            small => u64::from(small),
        };
        let root_sectors = (root_entries * 32).div_ceil(bytes_per_sector);
        let data_sector = reserved + fats * fat_sectors + root_sectors;
        if reserved == 0 || fats == 0 || fat_sectors == 0 || data_sector >= total {
            return Err(fat("the boot sector's geometry leaves no data region"));
        }
        if total * bytes_per_sector > length {
            return Err(fat("the file system is larger than its partition"));
        }
        let clusters = (total - data_sector) / sectors_per_cluster;
        if clusters < 4085 {
            return Err(BootError::Unsupported("FAT12".into()));
        }
        let fat32 = clusters >= 65_525;
        let fat_entries = fat_sectors * bytes_per_sector / if fat32 { 4 } else { 2 };
        if fat_entries < clusters + 2 {
            return Err(fat("the FAT is smaller than the cluster count"));
        }
        Ok(Fat {
            disk,
            base,
            cluster_bytes: bytes_per_sector * sectors_per_cluster,
            fat_offset: reserved * bytes_per_sector,
            data_offset: data_sector * bytes_per_sector,
            cluster_count: u32::try_from(clusters).map_err(|_| fat("too many clusters"))?,
            fat32,
            fixed_root: (!fat32).then(|| {
                let offset = (reserved + fats * fat_sectors) * bytes_per_sector;
                (offset, root_entries as usize)
            }),
            root_cluster: if fat32 { u32_le(&boot, 44) } else { 0 },
        })
    }

    /// The whole file at `path` (`\`- or `/`-separated, matched without regard to case, as
    /// the firmware does).
    pub fn read_file(&self, path: &str) -> Result<Vec<u8>, BootError> {
        let parts: Vec<&str> = path.split(['\\', '/']).filter(|p| !p.is_empty()).collect();
        if parts.is_empty() || parts.len() > MAX_DEPTH {
            return Err(fat(&format!("path {path:?}")));
        }
        let not_found = || BootError::NotFound(path.to_string());
        let mut directory = self.root()?;
        let mut found = None;
        for (index, part) in parts.iter().enumerate() {
            let entry = find(&directory, part).ok_or_else(not_found)?;
            let last = index + 1 == parts.len();
            if entry.directory == last {
                return Err(not_found());
            }
            if last {
                found = Some(entry);
            } else {
                directory = self.chain(entry.cluster, None)?;
            }
        }
        let entry = found.ok_or_else(not_found)?;
        if u64::from(entry.size) > MAX_FILE_BYTES {
            return Err(BootError::TooLarge(path.to_string()));
        }
        if entry.size == 0 {
            return Ok(Vec::new());
        }
        self.chain(entry.cluster, Some(u64::from(entry.size)))
    }

    fn root(&self) -> Result<Vec<u8>, BootError> {
        match self.fixed_root {
            Some((offset, entries)) => {
                let mut bytes = vec![0u8; entries * 32];
                self.disk.read_at(self.base + offset, &mut bytes)?;
                Ok(bytes)
            }
            None => self.chain(self.root_cluster, None),
        }
    }

    /// The bytes of the chain from `first`: `size` of them for a file, the whole chain (at
    /// most a directory's bound) for a directory.
    fn chain(&self, first: u32, size: Option<u64>) -> Result<Vec<u8>, BootError> {
        let limit = size.unwrap_or((MAX_DIRECTORY_ENTRIES * 32) as u64);
        let mut out = Vec::new();
        let mut cluster = first;
        while (out.len() as u64) < limit {
            if cluster < 2 || cluster >= self.cluster_count + 2 {
                if size.is_none() && self.is_end(cluster) && !out.is_empty() {
                    break;
                }
                return Err(fat(&format!(
                    "the chain from cluster {first} reaches {cluster:#x}"
                )));
            }
            let start = out.len();
            let take = self.cluster_bytes.min(limit - start as u64) as usize;
            out.resize(start + take, 0);
            let offset = self.data_offset + u64::from(cluster - 2) * self.cluster_bytes;
            self.disk.read_at(self.base + offset, &mut out[start..])?;
            cluster = self.next(cluster)?;
        }
        if size.is_none() && !self.is_end(cluster) {
            return Err(fat(&format!(
                "directory from cluster {first} is over {MAX_DIRECTORY_ENTRIES} entries"
            )));
        }
        Ok(out)
    }

    fn next(&self, cluster: u32) -> Result<u32, BootError> {
        let width = if self.fat32 { 4 } else { 2 };
        let mut bytes = [0u8; 4];
        let at = self.fat_offset + u64::from(cluster) * width;
        self.disk
            .read_at(self.base + at, &mut bytes[..width as usize])?;
        Ok(if self.fat32 {
            u32::from_le_bytes(bytes) & 0x0fff_ffff
        } else {
            u32::from(u16::from_le_bytes([bytes[0], bytes[1]]))
        })
    }

    fn is_end(&self, cluster: u32) -> bool {
        if self.fat32 {
            cluster >= 0x0fff_fff8
        } else {
            cluster >= 0xfff8
        }
    }
}

/// The entry named `name` in a directory's bytes: its long name or its 8.3 name, either
/// matched without regard to case.
fn find(directory: &[u8], name: &str) -> Option<Entry> {
    let wanted = name.to_lowercase();
    let mut long: Vec<u16> = Vec::new();
    for raw in directory.chunks_exact(32).take(MAX_DIRECTORY_ENTRIES) {
        match raw[0] {
            0x00 => return None,
            0xe5 => {
                long.clear();
                continue;
            }
            _ => {}
        }
        let attributes = raw[11];
        if attributes & 0x3f == ATTR_LONG_NAME {
            if raw[0] & 0x40 != 0 {
                long.clear();
            }
            // Long-name entries come last piece first: each goes before what was read.
            let mut piece: Vec<u16> = [1..11, 14..26, 28..32]
                .into_iter()
                .flat_map(|range| {
                    raw[range]
                        .chunks_exact(2)
                        .map(|c| u16::from_le_bytes([c[0], c[1]]))
                })
                .take_while(|&unit| unit != 0 && unit != 0xffff)
                .collect();
            piece.extend_from_slice(&long);
            long = piece;
            continue;
        }
        let long_name = String::from_utf16_lossy(&long);
        long.clear();
        if attributes & ATTR_VOLUME_ID != 0 {
            continue;
        }
        if long_name.to_lowercase() == wanted || short_name(raw).to_lowercase() == wanted {
            return Some(Entry {
                cluster: (u32::from(u16_le(raw, 20)) << 16) | u32::from(u16_le(raw, 26)),
                size: u32_le(raw, 28),
                directory: attributes & ATTR_DIRECTORY != 0,
            });
        }
    }
    None
}

fn short_name(raw: &[u8]) -> String {
    let base = String::from_utf8_lossy(&raw[..8]).trim_end().to_string();
    let extension = String::from_utf8_lossy(&raw[8..11]).trim_end().to_string();
    if extension.is_empty() {
        base
    } else {
        format!("{base}.{extension}")
    }
}

fn fat(why: &str) -> BootError {
    BootError::Fat(why.to_string())
}

fn u16_le(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn u32_le(bytes: &[u8], at: usize) -> u32 {
    super::gpt::u32_le(bytes, at)
}
