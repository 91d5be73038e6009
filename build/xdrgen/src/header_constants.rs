//! Constants that libvirt's `.x` files use but define only in libvirt's C headers (they reach
//! rpcgen through `%#include` lines, which this generator skips). Each entry names the header
//! it mirrors; the values are fixed parts of libvirt's ABI.

pub const HEADER_CONSTANTS: &[(&str, i64)] = &[
    // rpc/types.h: the boolean literals usable as `case TRUE:` labels.
    ("TRUE", 1),
    ("FALSE", 0),
    // include/libvirt/libvirt-host.h: `#define VIR_UUID_BUFLEN (16)`
    ("VIR_UUID_BUFLEN", 16),
    // include/libvirt/libvirt-host.h: `#define VIR_SECURITY_LABEL_BUFLEN (4096 + 1)`
    ("VIR_SECURITY_LABEL_BUFLEN", 4097),
    // include/libvirt/libvirt-host.h: `#define VIR_SECURITY_MODEL_BUFLEN (256 + 1)`
    ("VIR_SECURITY_MODEL_BUFLEN", 257),
    // include/libvirt/libvirt-host.h: `#define VIR_SECURITY_DOI_BUFLEN (256 + 1)`
    ("VIR_SECURITY_DOI_BUFLEN", 257),
    // include/libvirt/libvirt-common.h.in: enum virTypedParameterType
    ("VIR_TYPED_PARAM_INT", 1),
    ("VIR_TYPED_PARAM_UINT", 2),
    ("VIR_TYPED_PARAM_LLONG", 3),
    ("VIR_TYPED_PARAM_ULLONG", 4),
    ("VIR_TYPED_PARAM_DOUBLE", 5),
    ("VIR_TYPED_PARAM_BOOLEAN", 6),
    ("VIR_TYPED_PARAM_STRING", 7),
];
