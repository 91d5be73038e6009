use std::collections::BTreeMap;
use std::io::Cursor;

use bytes::Bytes;

use crate::name::validate_component;
use crate::{Error, Result};

/// The most directory levels ECMA-119 §6.8.2.1 allows, the root counting as the first.
///
/// The limit is applied rather than waived (as `genisoimage -D` would) because it is cheap to
/// respect and some readers enforce it; a file may therefore sit at most seven directories deep.
pub const MAX_DIRECTORY_LEVELS: usize = 8;

/// The largest file: ISO 9660 records a file's length in 32 bits, and this writer does not use
/// multi-extent files.
pub const MAX_FILE_SIZE: u64 = u32::MAX as u64;

/// The files and directories of an image, keyed by their real (Joliet) names.
///
/// Each file carries its size and a source `S` the writer reads its bytes from later: a
/// reader for [`crate::Image::write_to`], an async reader for `write_to_async`, or
/// `Cursor<Bytes>` (see [`Tree::add_bytes`]) for either. Everything a name or size could make
/// unrepresentable is refused here, when the entry is added, and leaves the tree unchanged.
#[derive(Debug)]
pub struct Tree<S> {
    pub(crate) root: Directory<S>,
}

#[derive(Debug)]
pub(crate) struct Directory<S> {
    pub(crate) entries: BTreeMap<String, Node<S>>,
}

#[derive(Debug)]
pub(crate) enum Node<S> {
    Directory(Directory<S>),
    File { size: u64, source: S },
}

impl<S> Directory<S> {
    fn new() -> Self {
        Directory {
            entries: BTreeMap::new(),
        }
    }
}

impl<S> Default for Tree<S> {
    fn default() -> Self {
        Tree {
            root: Directory::new(),
        }
    }
}

impl<S> Tree<S> {
    /// An empty tree: just the root directory.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a file of `size` bytes at `path` (components separated by `/`, an optional
    /// leading `/`), creating missing parent directories.
    ///
    /// The source must later yield exactly `size` bytes; the writer fails with
    /// [`Error::SourceTooShort`] or [`Error::SourceTooLong`] otherwise.
    pub fn add_file(&mut self, path: &str, size: u64, source: S) -> Result<()> {
        let components = split_path(path)?;
        check_levels(path, components.len())?;
        if size > MAX_FILE_SIZE {
            return Err(Error::FileTooLarge {
                path: path.to_owned(),
                size,
            });
        }
        let (name, parents) = components.split_last().ok_or_else(|| Error::EmptyName {
            path: path.to_owned(),
        })?;
        let parent = self.directory_mut(path, parents)?;
        if parent.entries.contains_key(*name) {
            return Err(Error::DuplicatePath {
                path: path.to_owned(),
            });
        }
        parent
            .entries
            .insert((*name).to_owned(), Node::File { size, source });
        Ok(())
    }

    /// Adds a directory at `path` and any missing parents; adding one that exists is a no-op.
    pub fn add_directory(&mut self, path: &str) -> Result<()> {
        let components = split_path(path)?;
        check_levels(path, components.len() + 1)?;
        self.directory_mut(path, &components).map(|_| ())
    }

    /// Walks to (creating as needed) the directory at `components`, after checking that none
    /// of them is a file so that a failure leaves the tree as it was.
    fn directory_mut(&mut self, path: &str, components: &[&str]) -> Result<&mut Directory<S>> {
        let mut probe = &self.root;
        for (depth, component) in components.iter().enumerate() {
            match probe.entries.get(*component) {
                Some(Node::Directory(next)) => probe = next,
                Some(Node::File { .. }) => {
                    return Err(Error::NotADirectory {
                        path: path.to_owned(),
                        file: components[..=depth].join("/"),
                    });
                }
                None => break,
            }
        }
        let mut directory = &mut self.root;
        for component in components {
            let node = directory
                .entries
                .entry((*component).to_owned())
                .or_insert_with(|| Node::Directory(Directory::new()));
            directory = match node {
                Node::Directory(next) => next,
                // Ruled out by the probe above.
                Node::File { .. } => {
                    return Err(Error::NotADirectory {
                        path: path.to_owned(),
                        file: (*component).to_owned(),
                    });
                }
            };
        }
        Ok(directory)
    }
}

impl Tree<Cursor<Bytes>> {
    /// Adds a file whose bytes are already in memory.
    pub fn add_bytes(&mut self, path: &str, data: impl Into<Bytes>) -> Result<()> {
        let data = data.into();
        let size = data.len() as u64;
        self.add_file(path, size, Cursor::new(data))
    }
}

/// Splits and validates a path; a single leading `/` is allowed and means the root.
fn split_path(path: &str) -> Result<Vec<&str>> {
    let relative = path.strip_prefix('/').unwrap_or(path);
    if relative.is_empty() {
        return Err(Error::EmptyName {
            path: path.to_owned(),
        });
    }
    let components: Vec<&str> = relative.split('/').collect();
    for component in &components {
        if component.is_empty() {
            return Err(Error::EmptyName {
                path: path.to_owned(),
            });
        }
        validate_component(component, path)?;
    }
    Ok(components)
}

fn check_levels(path: &str, levels: usize) -> Result<()> {
    if levels > MAX_DIRECTORY_LEVELS {
        return Err(Error::TooDeep {
            path: path.to_owned(),
            levels,
            max: MAX_DIRECTORY_LEVELS,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_limit_counts_the_root() {
        let mut tree = Tree::<Cursor<Bytes>>::new();
        tree.add_bytes("1/2/3/4/5/6/7/file", "x").unwrap();
        assert!(matches!(
            tree.add_bytes("1/2/3/4/5/6/7/8/file", "x"),
            Err(Error::TooDeep { levels: 9, .. })
        ));
        tree.add_directory("1/2/3/4/5/6/7").unwrap();
        assert!(matches!(
            tree.add_directory("1/2/3/4/5/6/7/8"),
            Err(Error::TooDeep { .. })
        ));
    }

    #[test]
    fn refuses_conflicts_without_changing_the_tree() {
        let mut tree = Tree::<Cursor<Bytes>>::new();
        tree.add_bytes("/a", "x").unwrap();
        assert!(matches!(
            tree.add_bytes("a", "y"),
            Err(Error::DuplicatePath { .. })
        ));
        assert!(matches!(
            tree.add_bytes("a/b", "y"),
            Err(Error::NotADirectory { .. })
        ));
        assert!(matches!(
            tree.add_directory("a"),
            Err(Error::NotADirectory { .. })
        ));
        assert!(matches!(
            tree.add_bytes("b//c", "y"),
            Err(Error::EmptyName { .. })
        ));
        assert!(matches!(
            tree.add_bytes("/", "y"),
            Err(Error::EmptyName { .. })
        ));
        assert!(matches!(
            tree.add_file("big", MAX_FILE_SIZE + 1, Cursor::new(Bytes::new())),
            Err(Error::FileTooLarge { .. })
        ));
        assert_eq!(tree.root.entries.len(), 1);
    }
}
