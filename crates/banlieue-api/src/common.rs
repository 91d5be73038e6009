//! Shapes shared by several resources: references, value-or-source fields, addresses.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The key a value-or-source field reads when none is given.
pub const DEFAULT_CA_KEY: &str = "ca.crt";

fn default_ca_key() -> String {
    DEFAULT_CA_KEY.to_owned()
}

/// Drops an enum's own description from its schema. kube hoists an `Option<Enum>`'s schema
/// over the field's, so without this the field's description would be replaced by the enum's.
pub(crate) fn without_description(schema: &mut schemars::Schema) {
    schema.remove("description");
}

/// A reference to another object in the same namespace, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LocalObjectReference {
    /// Name of the referenced object, in the referring object's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

impl LocalObjectReference {
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
}

/// One key of a ConfigMap or Secret in the referring object's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct KeySelector {
    /// Name of the ConfigMap or Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key inside it. Defaults to `ca.crt`.
    #[serde(default = "default_ca_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// A PEM bundle given in place, or read from one key of a ConfigMap or Secret.
/// Exactly one of the three is set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "[has(self.inline), has(self.configMapRef), has(self.secretRef)].filter(x, x).size() == 1",
    "message": "exactly one of inline, configMapRef or secretRef must be set"
}]))]
pub struct ValueOrSource {
    /// The PEM text itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1048576))]
    pub inline: Option<String>,
    /// A ConfigMap key holding the PEM text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<KeySelector>,
    /// A Secret key holding the PEM text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<KeySelector>,
}

/// Which of the three sources a [`ValueOrSource`] names, once validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source<'a> {
    Inline(&'a str),
    ConfigMap(&'a KeySelector),
    Secret(&'a KeySelector),
}

impl ValueOrSource {
    /// The single source set, or `None` when zero or several are set (the API server's CEL rule
    /// rejects both, but a reader must not trust that).
    pub fn source(&self) -> Option<Source<'_>> {
        match (&self.inline, &self.config_map_ref, &self.secret_ref) {
            (Some(v), None, None) => Some(Source::Inline(v)),
            (None, Some(k), None) => Some(Source::ConfigMap(k)),
            (None, None, Some(k)) => Some(Source::Secret(k)),
            _ => None,
        }
    }
}

/// A reference to a Secret key that holds sensitive bytes (for example cloud-init user-data).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SecretKeySelector {
    /// Name of the Secret, in the referring object's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key inside the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// One network address of a machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MachineAddress {
    /// Address kind, as in Cluster API: `InternalIP`, `ExternalIP`, `Hostname`, `InternalDNS`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The address.
    pub address: String,
}

/// Address kinds.
pub mod address_type {
    pub const INTERNAL_IP: &str = "InternalIP";
    pub const EXTERNAL_IP: &str = "ExternalIP";
    pub const HOSTNAME: &str = "Hostname";
}

/// How a warm member waits for its claim (ADR-0073).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Standby {
    /// Running: the member holds its memory on the host while it waits.
    #[default]
    Running,
    /// Saved to disk once it has reached its pool's readiness (libvirt managed save, vSphere
    /// suspend): it holds no host memory while it waits, and is resumed when claimed.
    Saved,
}

/// Firmware a machine boots with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Firmware {
    /// Legacy BIOS (SeaBIOS).
    #[default]
    Bios,
    /// UEFI; the hypervisor selects the loader and gives each machine its own variable store.
    Efi,
}
