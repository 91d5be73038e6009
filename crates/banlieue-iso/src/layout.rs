//! From a [`Tree`] to sector numbers and the encoded directory structures.
//!
//! Layout needs only names and sizes, so it happens before any file byte is read: the volume
//! is the system area, the descriptors, four path tables, the primary then the Joliet
//! directories, and finally the file data, which both trees share.

use std::collections::VecDeque;

use crate::name::{MAX_DIRECTORY_ENTRIES, assign_level1_identifiers, ucs2_be};
use crate::time::UNSPECIFIED_VOLUME_DATE;
use crate::tree::{Directory, Node};
use crate::{Error, Result, Timestamp, Tree, VolumeLabel};

/// Bytes per logical sector (and logical block: this writer makes them equal).
pub const SECTOR_SIZE: usize = 2048;
const SECTOR: u64 = SECTOR_SIZE as u64;
/// ECMA-119 reserves the first 16 sectors for the system area.
const SYSTEM_AREA_SECTORS: u32 = 16;
const PRIMARY_DESCRIPTOR_SECTOR: u32 = SYSTEM_AREA_SECTORS;
const JOLIET_DESCRIPTOR_SECTOR: u32 = 17;
const TERMINATOR_SECTOR: u32 = 18;
const FIRST_FREE_SECTOR: u32 = 19;
/// Path tables name parents by a 16-bit directory number.
const MAX_DIRECTORIES: usize = u16::MAX as usize;
/// Joliet level 3 (UCS-2 without restrictions), ECMA-35 escape `%/E`.
const JOLIET_LEVEL3_ESCAPE: &[u8; 3] = b"%/E";
const FILE_FLAG_DIRECTORY: u8 = 0x02;
/// Shown by `isoinfo -d` and others; says which program wrote the volume.
const APPLICATION_ID: &str = "BANLIEUE-ISO";

/// Settings that apply to the whole volume.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageOptions {
    /// The volume label; cloud-init looks for `cidata`.
    pub volume_label: VolumeLabel,
    /// The instant recorded for the volume and for every entry.
    pub timestamp: Timestamp,
}

/// One file or directory of a laid-out image, as both trees name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The path in the Joliet tree, the real name: `/dir/meta-data`.
    pub joliet_path: String,
    /// The path in the primary tree: `/DIR/META_DAT.;1`.
    pub primary_path: String,
    /// The file's size; zero for directories.
    pub size: u64,
    /// Whether this is a directory.
    pub is_directory: bool,
}

/// A laid-out image: the encoded directory structures plus, for each file, the source its
/// bytes will be streamed from.
///
/// Produced by [`Image::plan`]; written by [`Image::write_to`], `write_to_async` (feature
/// `tokio`) or [`Image::to_bytes`]. Holding one costs the directory structures (a few sectors
/// per directory) and the sources, never file contents.
#[derive(Debug)]
pub struct Image<S> {
    /// Sectors `0..data_start`: system area, descriptors, path tables, directories.
    pub(crate) metadata: Vec<u8>,
    /// Non-empty files in the order their data follows the metadata.
    pub(crate) files: Vec<PlacedFile<S>>,
    pub(crate) total_sectors: u32,
    entries: Vec<Entry>,
}

#[derive(Debug)]
pub(crate) struct PlacedFile<S> {
    pub(crate) path: String,
    pub(crate) size: u64,
    pub(crate) source: S,
}

/// A directory while laying out; index 0 is the root.
struct DirInfo {
    parent: usize,
    primary_id: Vec<u8>,
    joliet_id: Vec<u8>,
    children: Vec<Child>,
}

struct Child {
    kind: ChildKind,
    primary_id: Vec<u8>,
    joliet_id: Vec<u8>,
}

#[derive(Clone, Copy)]
enum ChildKind {
    Directory(usize),
    File(usize),
}

struct FileInfo {
    size: u64,
    extent: u32,
}

/// Which of the two hierarchies an operation is about.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hierarchy {
    Primary,
    Joliet,
}

impl Hierarchy {
    fn dir_id(self, dir: &DirInfo) -> &[u8] {
        match self {
            Hierarchy::Primary => &dir.primary_id,
            Hierarchy::Joliet => &dir.joliet_id,
        }
    }

    fn child_id(self, child: &Child) -> &[u8] {
        match self {
            Hierarchy::Primary => &child.primary_id,
            Hierarchy::Joliet => &child.joliet_id,
        }
    }
}

/// Sector numbers and sizes of one hierarchy's directories and path tables.
struct HierarchyLayout {
    /// Directory indices in path-table order; a directory's number is its position + 1.
    order: Vec<usize>,
    /// Directory number by directory index.
    number: Vec<u16>,
    extent: Vec<u32>,
    size: Vec<u32>,
    path_table_size: u32,
    path_table_l: u32,
    path_table_m: u32,
}

/// Collects directories and files from the tree, depth-first in real-name order, which is
/// also the order file data is written in.
struct Collected<S> {
    dirs: Vec<DirInfo>,
    files: Vec<FileInfo>,
    sources: Vec<(String, S)>,
    entries: Vec<Entry>,
}

impl<S> Collected<S> {
    fn directory(
        &mut self,
        dir: Directory<S>,
        index: usize,
        joliet_path: &str,
        primary_path: &str,
    ) -> Result<()> {
        if dir.entries.len() > MAX_DIRECTORY_ENTRIES {
            return Err(Error::TooManyEntries {
                count: dir.entries.len(),
                max: MAX_DIRECTORY_ENTRIES,
            });
        }
        let names: Vec<(&str, bool)> = dir
            .entries
            .iter()
            .map(|(name, node)| (name.as_str(), matches!(node, Node::Directory(_))))
            .collect();
        let primary_ids = assign_level1_identifiers(&names)?;
        for ((name, node), primary_id) in dir.entries.into_iter().zip(primary_ids) {
            let joliet_id = ucs2_be(&name);
            let child_joliet = format!("{joliet_path}/{name}");
            let child_primary = format!("{primary_path}/{}", String::from_utf8_lossy(&primary_id));
            match node {
                Node::Directory(sub) => {
                    let sub_index = self.dirs.len();
                    if sub_index >= MAX_DIRECTORIES {
                        return Err(Error::TooManyDirectories {
                            count: sub_index + 1,
                            max: MAX_DIRECTORIES,
                        });
                    }
                    self.dirs.push(DirInfo {
                        parent: index,
                        primary_id: primary_id.clone(),
                        joliet_id: joliet_id.clone(),
                        children: Vec::new(),
                    });
                    self.dirs[index].children.push(Child {
                        kind: ChildKind::Directory(sub_index),
                        primary_id,
                        joliet_id,
                    });
                    self.entries.push(Entry {
                        joliet_path: child_joliet.clone(),
                        primary_path: child_primary.clone(),
                        size: 0,
                        is_directory: true,
                    });
                    self.directory(sub, sub_index, &child_joliet, &child_primary)?;
                }
                Node::File { size, source } => {
                    let file_index = self.files.len();
                    self.files.push(FileInfo { size, extent: 0 });
                    self.sources.push((child_joliet.clone(), source));
                    self.dirs[index].children.push(Child {
                        kind: ChildKind::File(file_index),
                        primary_id,
                        joliet_id,
                    });
                    self.entries.push(Entry {
                        joliet_path: child_joliet,
                        primary_path: child_primary,
                        size,
                        is_directory: false,
                    });
                }
            }
        }
        Ok(())
    }
}

impl<S> Image<S> {
    /// Lays out `tree`: derives primary names, numbers directories, assigns every sector and
    /// encodes the directory structures. Reads no file data.
    pub fn plan(tree: Tree<S>, options: &ImageOptions) -> Result<Self> {
        let mut collected = Collected {
            dirs: vec![DirInfo {
                parent: 0,
                primary_id: vec![0],
                joliet_id: vec![0],
                children: Vec::new(),
            }],
            files: Vec::new(),
            sources: Vec::new(),
            entries: Vec::new(),
        };
        collected.directory(tree.root, 0, "", "")?;
        let Collected {
            mut dirs,
            mut files,
            sources,
            entries,
        } = collected;
        for dir in &mut dirs {
            // Joliet records are ordered by their UCS-2 identifiers; the primary order is
            // derived from this one where it is needed.
            dir.children.sort_by(|a, b| a.joliet_id.cmp(&b.joliet_id));
        }

        let mut next = SectorCursor(FIRST_FREE_SECTOR);
        let mut primary = HierarchyLayout::new(&dirs, Hierarchy::Primary);
        let mut joliet = HierarchyLayout::new(&dirs, Hierarchy::Joliet);
        for layout in [&mut primary, &mut joliet] {
            layout.path_table_l = next.take_bytes(u64::from(layout.path_table_size))?;
            layout.path_table_m = next.take_bytes(u64::from(layout.path_table_size))?;
        }
        for (layout, hierarchy) in [
            (&mut primary, Hierarchy::Primary),
            (&mut joliet, Hierarchy::Joliet),
        ] {
            for position in 0..layout.order.len() {
                let index = layout.order[position];
                let size = directory_size(&dirs[index], hierarchy)?;
                layout.size[index] = size;
                layout.extent[index] = next.take_bytes(u64::from(size))?;
            }
        }
        let data_start = next.0;
        for file in &mut files {
            // An empty file occupies nothing; like genisoimage, point it at the next free
            // sector so that no reader sees it overlap the directory structures.
            file.extent = next.take_bytes(file.size)?;
        }
        let total_sectors = next.0;

        let mut metadata = vec![0u8; data_start as usize * SECTOR_SIZE];
        let ts = options.timestamp;
        for (layout, hierarchy) in [(&primary, Hierarchy::Primary), (&joliet, Hierarchy::Joliet)] {
            write_path_tables(&mut metadata, &dirs, layout, hierarchy);
            for &index in &layout.order {
                write_directory(&mut metadata, &dirs, &files, layout, hierarchy, index, ts);
            }
        }
        write_volume_descriptor(
            &mut metadata,
            options,
            &primary,
            Hierarchy::Primary,
            total_sectors,
        );
        write_volume_descriptor(
            &mut metadata,
            options,
            &joliet,
            Hierarchy::Joliet,
            total_sectors,
        );
        let terminator = sector_mut(&mut metadata, TERMINATOR_SECTOR);
        terminator[0] = 255;
        terminator[1..6].copy_from_slice(b"CD001");
        terminator[6] = 1;

        let placed = files
            .iter()
            .zip(sources)
            .filter(|(info, _)| info.size > 0)
            .map(|(info, (path, source))| PlacedFile {
                path,
                size: info.size,
                source,
            })
            .collect();
        Ok(Image {
            metadata,
            files: placed,
            total_sectors,
            entries,
        })
    }

    /// Every file and directory, depth-first in real-name order, with its name in both trees.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The image's size in bytes: always a whole number of sectors.
    pub fn size_bytes(&self) -> u64 {
        u64::from(self.total_sectors) * SECTOR
    }
}

/// Hands out consecutive sectors and refuses to run past 2^32 of them.
struct SectorCursor(u32);

impl SectorCursor {
    fn take_bytes(&mut self, bytes: u64) -> Result<u32> {
        let start = self.0;
        let sectors = bytes.div_ceil(SECTOR);
        let end = u64::from(start) + sectors;
        self.0 = u32::try_from(end).map_err(|_| Error::ImageTooLarge {
            bytes: end.saturating_mul(SECTOR),
            max: u64::from(u32::MAX) * SECTOR,
        })?;
        Ok(start)
    }
}

impl HierarchyLayout {
    fn new(dirs: &[DirInfo], hierarchy: Hierarchy) -> Self {
        // Breadth-first, each parent's subdirectories sorted by identifier, gives exactly the
        // order ECMA-119 §9.4 prescribes: by level, then parent number, then identifier.
        let mut order = Vec::with_capacity(dirs.len());
        let mut queue = VecDeque::from([0usize]);
        while let Some(index) = queue.pop_front() {
            order.push(index);
            let mut subdirs: Vec<usize> = dirs[index]
                .children
                .iter()
                .filter_map(|child| match child.kind {
                    ChildKind::Directory(sub) => Some(sub),
                    ChildKind::File(_) => None,
                })
                .collect();
            subdirs.sort_by(|&a, &b| hierarchy.dir_id(&dirs[a]).cmp(hierarchy.dir_id(&dirs[b])));
            queue.extend(subdirs);
        }
        let mut number = vec![0u16; dirs.len()];
        for (position, &index) in order.iter().enumerate() {
            // `plan` refuses more than u16::MAX directories before getting here.
            number[index] = (position + 1) as u16;
        }
        let path_table_size = order
            .iter()
            .map(|&index| path_table_record_len(hierarchy.dir_id(&dirs[index]).len()))
            .sum::<usize>() as u32;
        HierarchyLayout {
            order,
            number,
            extent: vec![0; dirs.len()],
            size: vec![0; dirs.len()],
            path_table_size,
            path_table_l: 0,
            path_table_m: 0,
        }
    }
}

fn path_table_record_len(id_len: usize) -> usize {
    8 + id_len + id_len % 2
}

fn directory_record_len(id_len: usize) -> usize {
    // The identifier is followed by a pad byte when its length is even, keeping records even.
    33 + id_len + (1 - id_len % 2)
}

/// Children in the order their records appear: sorted by the hierarchy's identifier.
fn sorted_children(dir: &DirInfo, hierarchy: Hierarchy) -> Vec<&Child> {
    let mut children: Vec<&Child> = dir.children.iter().collect();
    if hierarchy == Hierarchy::Primary {
        children.sort_by(|a, b| a.primary_id.cmp(&b.primary_id));
    }
    children
}

/// Offsets of each record in a directory's extent; records never straddle a sector.
fn record_offsets(lengths: impl Iterator<Item = usize>) -> (Vec<usize>, usize) {
    let mut offsets = Vec::new();
    let mut at = 0usize;
    for len in lengths {
        let room = SECTOR_SIZE - at % SECTOR_SIZE;
        if len > room {
            at += room;
        }
        offsets.push(at);
        at += len;
    }
    (offsets, at.div_ceil(SECTOR_SIZE).max(1) * SECTOR_SIZE)
}

fn record_lengths<'a>(dir: &'a DirInfo, hierarchy: Hierarchy) -> impl Iterator<Item = usize> + 'a {
    let own = [directory_record_len(1), directory_record_len(1)];
    own.into_iter().chain(
        sorted_children(dir, hierarchy)
            .into_iter()
            .map(move |c| directory_record_len(hierarchy.child_id(c).len())),
    )
}

fn directory_size(dir: &DirInfo, hierarchy: Hierarchy) -> Result<u32> {
    let (_, size) = record_offsets(record_lengths(dir, hierarchy));
    u32::try_from(size).map_err(|_| Error::ImageTooLarge {
        bytes: size as u64,
        max: u64::from(u32::MAX),
    })
}

fn sector_mut(metadata: &mut [u8], sector: u32) -> &mut [u8] {
    let start = sector as usize * SECTOR_SIZE;
    &mut metadata[start..start + SECTOR_SIZE]
}

fn put_both_u32(out: &mut [u8], value: u32) {
    out[..4].copy_from_slice(&value.to_le_bytes());
    out[4..8].copy_from_slice(&value.to_be_bytes());
}

fn put_both_u16(out: &mut [u8], value: u16) {
    out[..2].copy_from_slice(&value.to_le_bytes());
    out[2..4].copy_from_slice(&value.to_be_bytes());
}

/// Encodes one directory record (ECMA-119 §9.1) into `out`, which is exactly its length.
fn put_directory_record(
    out: &mut [u8],
    extent: u32,
    size: u32,
    is_directory: bool,
    id: &[u8],
    recorded: [u8; 7],
) {
    out[0] = out.len() as u8;
    out[1] = 0; // no extended attribute record
    put_both_u32(&mut out[2..10], extent);
    put_both_u32(&mut out[10..18], size);
    out[18..25].copy_from_slice(&recorded);
    out[25] = if is_directory { FILE_FLAG_DIRECTORY } else { 0 };
    out[26] = 0; // not interleaved
    out[27] = 0;
    put_both_u16(&mut out[28..32], 1); // volume sequence number
    out[32] = id.len() as u8;
    out[33..33 + id.len()].copy_from_slice(id);
}

fn write_directory(
    metadata: &mut [u8],
    dirs: &[DirInfo],
    files: &[FileInfo],
    layout: &HierarchyLayout,
    hierarchy: Hierarchy,
    index: usize,
    timestamp: Timestamp,
) {
    let dir = &dirs[index];
    let recorded = timestamp.directory_record_form();
    let base = layout.extent[index] as usize * SECTOR_SIZE;
    let (offsets, _) = record_offsets(record_lengths(dir, hierarchy));
    let children = sorted_children(dir, hierarchy);
    let parent = dir.parent;
    let records = [
        (layout.extent[index], layout.size[index], true, &[0u8][..]),
        (layout.extent[parent], layout.size[parent], true, &[1u8][..]),
    ]
    .into_iter()
    .chain(children.iter().map(|child| match child.kind {
        ChildKind::Directory(sub) => (
            layout.extent[sub],
            layout.size[sub],
            true,
            hierarchy.child_id(child),
        ),
        // Sizes were bounded to u32 when the file was added.
        ChildKind::File(file) => (
            files[file].extent,
            files[file].size as u32,
            false,
            hierarchy.child_id(child),
        ),
    }));
    for ((extent, size, is_directory, id), offset) in records.zip(offsets) {
        let start = base + offset;
        let len = directory_record_len(id.len());
        put_directory_record(
            &mut metadata[start..start + len],
            extent,
            size,
            is_directory,
            id,
            recorded,
        );
    }
}

fn write_path_tables(
    metadata: &mut [u8],
    dirs: &[DirInfo],
    layout: &HierarchyLayout,
    hierarchy: Hierarchy,
) {
    for little_endian in [true, false] {
        let sector = if little_endian {
            layout.path_table_l
        } else {
            layout.path_table_m
        };
        let mut at = sector as usize * SECTOR_SIZE;
        for &index in &layout.order {
            let dir = &dirs[index];
            let id = hierarchy.dir_id(dir);
            let len = path_table_record_len(id.len());
            let record = &mut metadata[at..at + len];
            record[0] = id.len() as u8;
            record[1] = 0;
            let extent = layout.extent[index];
            let parent = layout.number[dir.parent];
            if little_endian {
                record[2..6].copy_from_slice(&extent.to_le_bytes());
                record[6..8].copy_from_slice(&parent.to_le_bytes());
            } else {
                record[2..6].copy_from_slice(&extent.to_be_bytes());
                record[6..8].copy_from_slice(&parent.to_be_bytes());
            }
            record[8..8 + id.len()].copy_from_slice(id);
            at += len;
        }
    }
}

/// Fills a descriptor string field: ASCII padded with spaces in the primary descriptor,
/// UCS-2 padded with U+0020 in the Joliet one.
fn put_text(out: &mut [u8], text: &str, hierarchy: Hierarchy) {
    match hierarchy {
        Hierarchy::Primary => {
            out.fill(b' ');
            let bytes = text.as_bytes();
            let len = bytes.len().min(out.len());
            out[..len].copy_from_slice(&bytes[..len]);
        }
        Hierarchy::Joliet => {
            for pair in out.chunks_exact_mut(2) {
                pair.copy_from_slice(&[0, b' ']);
            }
            let encoded = ucs2_be(text);
            let len = encoded.len().min(out.len() & !1);
            out[..len].copy_from_slice(&encoded[..len]);
        }
    }
}

fn write_volume_descriptor(
    metadata: &mut [u8],
    options: &ImageOptions,
    layout: &HierarchyLayout,
    hierarchy: Hierarchy,
    total_sectors: u32,
) {
    let sector = match hierarchy {
        Hierarchy::Primary => PRIMARY_DESCRIPTOR_SECTOR,
        Hierarchy::Joliet => JOLIET_DESCRIPTOR_SECTOR,
    };
    let d = sector_mut(metadata, sector);
    d[0] = match hierarchy {
        Hierarchy::Primary => 1,
        Hierarchy::Joliet => 2,
    };
    d[1..6].copy_from_slice(b"CD001");
    d[6] = 1;
    put_text(&mut d[8..40], "", hierarchy); // system identifier
    put_text(&mut d[40..72], options.volume_label.as_str(), hierarchy);
    put_both_u32(&mut d[80..88], total_sectors);
    if hierarchy == Hierarchy::Joliet {
        d[88..91].copy_from_slice(JOLIET_LEVEL3_ESCAPE);
    }
    put_both_u16(&mut d[120..124], 1); // volume set size
    put_both_u16(&mut d[124..128], 1); // volume sequence number
    put_both_u16(&mut d[128..132], SECTOR_SIZE as u16);
    put_both_u32(&mut d[132..140], layout.path_table_size);
    d[140..144].copy_from_slice(&layout.path_table_l.to_le_bytes());
    d[148..152].copy_from_slice(&layout.path_table_m.to_be_bytes());
    let recorded = options.timestamp.directory_record_form();
    put_directory_record(
        &mut d[156..190],
        layout.extent[0],
        layout.size[0],
        true,
        &[0],
        recorded,
    );
    put_text(&mut d[190..318], "", hierarchy); // volume set
    put_text(&mut d[318..446], "", hierarchy); // publisher
    put_text(&mut d[446..574], "", hierarchy); // data preparer
    put_text(&mut d[574..702], APPLICATION_ID, hierarchy);
    put_text(&mut d[702..739], "", hierarchy); // copyright file
    put_text(&mut d[739..776], "", hierarchy); // abstract file
    put_text(&mut d[776..813], "", hierarchy); // bibliographic file
    let date = options.timestamp.volume_descriptor_form();
    d[813..830].copy_from_slice(&date); // creation
    d[830..847].copy_from_slice(&date); // modification
    d[847..864].copy_from_slice(&UNSPECIFIED_VOLUME_DATE); // expiration
    d[864..881].copy_from_slice(&UNSPECIFIED_VOLUME_DATE); // effective
    d[881] = 1; // file structure version
}
