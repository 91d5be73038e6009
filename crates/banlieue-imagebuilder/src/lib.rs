//! The hypervisor-agnostic half of banlieue's image pipeline: from what was pulled from an OCI
//! registry to a raw disk image file, the artifact.
//!
//! 1. [`manifest`] parses the manifest and image config (bounded); [`classify()`] decides the
//!    image's [`Shape`] or refuses it with a [`Refusal`].
//! 2. [`layer`] turns downloaded, digest-verified blobs into one disk file: decompressing a disk
//!    artifact's layer, or extracting a containerDisk's `disk/` file from its layer tars.
//! 3. [`qcow2`] converts a qcow2 disk to raw; [`artifact::copy_raw`] copies a raw one. Both write
//!    into an [`ArtifactWriter`], which keeps zero blocks as holes, hashes the content on a
//!    second thread ([`hashing`]) and renames the file into place when complete; a
//!    [`CompletionRecord`] beside it lets a later build of the same manifest reuse it.
//!
//! Those are blocking std I/O with bounded buffers, run in `spawn_blocking`. Around them:
//!
//! - [`reconcile`]: the reconciler (`banlieue imagebuild controller`) that resolves each
//!   VMImage's Url source to a manifest digest and keeps one build Job per digest ([`decide`]
//!   is its pure half; ADR-0064);
//! - [`build`]: what a build Job runs (`banlieue imagebuild run`); [`pull`] is its network side
//!   ([`challenge`] its authentication, without I/O), [`credentials`] how it reaches a registry, [`convert`] the blocking middle, [`publish`] how
//!   it writes `status.buildArtifact`;
//! - [`measure`]: the PCR reference values a built disk publishes;
//! - [`reason`]: why a build stops short, as published.

// A product function stays under clippy.toml's line limit (tests may be longer).
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod artifact;
pub mod build;
pub mod challenge;
pub mod classify;
pub mod convert;
pub mod credentials;
pub mod decide;
mod error;
pub mod hashing;
pub mod layer;
pub mod manifest;
pub mod measure;
pub mod publish;
pub mod pull;
pub mod qcow2;
pub mod reason;
pub mod reconcile;
pub mod sparse;
pub mod zstd;

pub use artifact::{ArtifactRecord, ArtifactWriter, CompletionRecord};
pub use classify::{Compression, DiskFormat, Refusal, Shape, classify};
pub use error::{Error, Result};
pub use sparse::DiskSink;
