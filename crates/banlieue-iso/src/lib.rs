//! ISO 9660 + Joliet images, written in process, and the cloud-init NoCloud seed built on them.
//!
//! The primary (ECMA-119) tree uses Level-1 8.3 names derived from the real ones, since names
//! such as `meta-data` cannot be spelled there; the Joliet tree carries the real names in
//! UCS-2. Layout is computed from names and sizes alone, then the image is streamed: the
//! directory structures from memory, each file from the caller's source. For a fixed input
//! and [`Timestamp`] the output is byte-identical.
//!
//! ```
//! use banlieue_iso::NoCloudSeed;
//!
//! let seed = NoCloudSeed::new("f81d4fae-7dec-11d0-a765-00a0c91e6bf6", "default-web-0")
//!     .with_user_data(&b"#cloud-config\n"[..]);
//! let image = seed.to_bytes()?;
//! assert_eq!(image.len() % 2048, 0);
//! # Ok::<(), banlieue_iso::Error>(())
//! ```
//!
//! General trees go through [`Tree`] and [`Image`]:
//!
//! ```
//! use banlieue_iso::{Image, ImageOptions, Tree, VolumeLabel};
//!
//! let mut tree = Tree::new();
//! tree.add_bytes("docs/read me.txt", "hello")?;
//! let options = ImageOptions { volume_label: VolumeLabel::new("DOCS")?, ..Default::default() };
//! let image = Image::plan(tree, &options)?;
//! assert_eq!(image.entries()[1].primary_path, "/DOCS/READ_ME.TXT;1");
//! let mut out = Vec::new();
//! image.write_to(&mut out)?;
//! # Ok::<(), banlieue_iso::Error>(())
//! ```

// A product function stays under clippy.toml's line limit (tests may be longer).
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

mod error;
mod label;
mod layout;
mod name;
mod seed;
mod time;
mod tree;
mod write;

pub use error::{Error, Result};
pub use label::{MAX_VOLUME_LABEL_LEN, VolumeLabel};
pub use layout::{Entry, Image, ImageOptions, SECTOR_SIZE};
pub use name::{MAX_DIRECTORY_ENTRIES, MAX_JOLIET_NAME_UNITS};
pub use seed::{NoCloudSeed, yaml_string};
pub use time::Timestamp;
pub use tree::{MAX_DIRECTORY_LEVELS, MAX_FILE_SIZE, Tree};
pub use write::MAX_IN_MEMORY_IMAGE;
