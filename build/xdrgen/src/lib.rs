//! XDR code generator.
