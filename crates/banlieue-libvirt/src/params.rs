//! Typed parameters (`virTypedParameter`): the name/value lists libvirt uses where a call's
//! fields grow from release to release: domain statistics ([`Client::all_domain_stats`]), the
//! tunable and job-completed events, job statistics, scheduler and block tunables.
//!
//! The wire form is the generated [`RemoteTypedParam`]; [`TypedParams`] keeps the daemon's
//! order and answers lookups by name. Numeric getters widen: libvirt documents most counters
//! as `unsigned long long` but sends some as `int` or `unsigned int`, and a caller should not
//! have to know which.

use crate::client::Client;
use crate::error::Result;
use crate::flags::{ConnectGetAllDomainStatsFlags, DomainStatsTypes};
use crate::handles::{Domain, DomainState};
use crate::proto::remote::{self, RemoteTypedParam, RemoteTypedParamValue, procedures as rp};

/// One parameter's value, in the type the daemon sent it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TypedValue {
    /// `VIR_TYPED_PARAM_INT`.
    Int(i32),
    /// `VIR_TYPED_PARAM_UINT`.
    UInt(u32),
    /// `VIR_TYPED_PARAM_LLONG`.
    LLong(i64),
    /// `VIR_TYPED_PARAM_ULLONG`.
    ULLong(u64),
    /// `VIR_TYPED_PARAM_DOUBLE`.
    Double(f64),
    /// `VIR_TYPED_PARAM_BOOLEAN`.
    Boolean(bool),
    /// `VIR_TYPED_PARAM_STRING`.
    String(String),
}

impl TypedValue {
    /// The value as an unsigned integer: any integer type that is not negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            TypedValue::Int(v) => u64::try_from(v).ok(),
            TypedValue::UInt(v) => Some(u64::from(v)),
            TypedValue::LLong(v) => u64::try_from(v).ok(),
            TypedValue::ULLong(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a signed integer: any integer type that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            TypedValue::Int(v) => Some(i64::from(v)),
            TypedValue::UInt(v) => Some(i64::from(v)),
            TypedValue::LLong(v) => Some(v),
            TypedValue::ULLong(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float: a double, or an integer converted.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            TypedValue::Double(v) => Some(v),
            TypedValue::Int(v) => Some(f64::from(v)),
            TypedValue::UInt(v) => Some(f64::from(v)),
            // Counters beyond 2^53 lose precision here; that is what a float asks for.
            TypedValue::LLong(v) => Some(v as f64),
            TypedValue::ULLong(v) => Some(v as f64),
            _ => None,
        }
    }

    /// The value as a boolean (booleans only).
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            TypedValue::Boolean(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a string (strings only).
    pub fn as_str(&self) -> Option<&str> {
        match self {
            TypedValue::String(v) => Some(v),
            _ => None,
        }
    }
}

impl From<RemoteTypedParamValue> for TypedValue {
    fn from(raw: RemoteTypedParamValue) -> TypedValue {
        match raw {
            RemoteTypedParamValue::Int(v) => TypedValue::Int(v),
            RemoteTypedParamValue::Uint(v) => TypedValue::UInt(v),
            RemoteTypedParamValue::Llong(v) => TypedValue::LLong(v),
            RemoteTypedParamValue::Ullong(v) => TypedValue::ULLong(v),
            RemoteTypedParamValue::Double(v) => TypedValue::Double(v),
            // libvirt sends 0 or 1; anything else is still "set", as in C.
            RemoteTypedParamValue::Boolean(v) => TypedValue::Boolean(v != 0),
            RemoteTypedParamValue::String(v) => TypedValue::String(v),
        }
    }
}

impl From<TypedValue> for RemoteTypedParamValue {
    fn from(value: TypedValue) -> RemoteTypedParamValue {
        match value {
            TypedValue::Int(v) => RemoteTypedParamValue::Int(v),
            TypedValue::UInt(v) => RemoteTypedParamValue::Uint(v),
            TypedValue::LLong(v) => RemoteTypedParamValue::Llong(v),
            TypedValue::ULLong(v) => RemoteTypedParamValue::Ullong(v),
            TypedValue::Double(v) => RemoteTypedParamValue::Double(v),
            TypedValue::Boolean(v) => RemoteTypedParamValue::Boolean(i32::from(v)),
            TypedValue::String(v) => RemoteTypedParamValue::String(v),
        }
    }
}

/// A list of typed parameters, in the daemon's order. Names may repeat (libvirt's string
/// lists do); [`TypedParams::get`] returns the first.
///
/// ```
/// use banlieue_libvirt::params::{TypedParams, TypedValue};
///
/// let params = TypedParams::from_iter([
///     ("cpu.time", TypedValue::ULLong(1_500_000)),
///     ("block.count", TypedValue::UInt(2)),
///     ("block.0.name", TypedValue::String("vda".into())),
/// ]);
/// assert_eq!(params.u64("cpu.time"), Some(1_500_000));
/// assert_eq!(params.u64("block.count"), Some(2));
/// assert_eq!(params.str("block.0.name"), Some("vda"));
/// assert_eq!(params.prefixed("block.0.").count(), 1);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TypedParams(Vec<(String, TypedValue)>);

impl TypedParams {
    /// The parameters of a reply or an event.
    pub fn from_raw(raw: Vec<RemoteTypedParam>) -> TypedParams {
        TypedParams(
            raw.into_iter()
                .map(|p| (p.field, TypedValue::from(p.value)))
                .collect(),
        )
    }

    /// The wire form, for a call that takes parameters.
    pub fn into_raw(self) -> Vec<RemoteTypedParam> {
        self.0
            .into_iter()
            .map(|(field, value)| RemoteTypedParam {
                field,
                value: value.into(),
            })
            .collect()
    }

    /// How many parameters there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// There are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every parameter, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &TypedValue)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v))
    }

    /// The parameters whose names start with `prefix`, with the prefix removed: the fields of
    /// one block device (`block.0.`), one vCPU (`vcpu.1.`), one interface (`net.0.`).
    pub fn prefixed<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a TypedValue)> + 'a {
        self.iter()
            .filter_map(move |(n, v)| n.strip_prefix(prefix).map(|rest| (rest, v)))
    }

    /// The first value named `name`.
    pub fn get(&self, name: &str) -> Option<&TypedValue> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// [`TypedParams::get`] as an unsigned integer ([`TypedValue::as_u64`]).
    pub fn u64(&self, name: &str) -> Option<u64> {
        self.get(name).and_then(TypedValue::as_u64)
    }

    /// [`TypedParams::get`] as a signed integer ([`TypedValue::as_i64`]).
    pub fn i64(&self, name: &str) -> Option<i64> {
        self.get(name).and_then(TypedValue::as_i64)
    }

    /// [`TypedParams::get`] as a float ([`TypedValue::as_f64`]).
    pub fn f64(&self, name: &str) -> Option<f64> {
        self.get(name).and_then(TypedValue::as_f64)
    }

    /// [`TypedParams::get`] as a boolean.
    pub fn bool(&self, name: &str) -> Option<bool> {
        self.get(name).and_then(TypedValue::as_bool)
    }

    /// [`TypedParams::get`] as a string.
    pub fn str(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(TypedValue::as_str)
    }

    /// Appends a parameter (for calls that take parameters).
    pub fn push(&mut self, name: impl Into<String>, value: TypedValue) {
        self.0.push((name.into(), value));
    }
}

impl<N: Into<String>> FromIterator<(N, TypedValue)> for TypedParams {
    fn from_iter<I: IntoIterator<Item = (N, TypedValue)>>(iter: I) -> TypedParams {
        TypedParams(iter.into_iter().map(|(n, v)| (n.into(), v)).collect())
    }
}

/// One domain's statistics (`virDomainStatsRecord`): which domain, and its parameters named as
/// in libvirt's `VIR_DOMAIN_STATS_*` macros (`state.state`, `cpu.time`, `balloon.current`,
/// `vcpu.<n>.time`, `block.<n>.rd.bytes`, …).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DomainStats {
    /// The domain.
    pub domain: Domain,
    /// Its statistics.
    pub params: TypedParams,
}

impl DomainStats {
    /// `state.state`: the domain's state, when the STATE group was asked for.
    pub fn state(&self) -> Option<DomainState> {
        self.params
            .i64("state.state")
            .and_then(|v| i32::try_from(v).ok())
            .map(DomainState::from_raw)
    }

    /// `cpu.time`: CPU time used, in nanoseconds, when the CPU_TOTAL group was asked for.
    pub fn cpu_time_ns(&self) -> Option<u64> {
        self.params.u64("cpu.time")
    }

    /// `balloon.current`: memory the guest has, in KiB, when the BALLOON group was asked for.
    pub fn balloon_current_kib(&self) -> Option<u64> {
        self.params.u64("balloon.current")
    }

    /// `vcpu.current`: vCPUs online, when the VCPU group was asked for.
    pub fn vcpu_current(&self) -> Option<u64> {
        self.params.u64("vcpu.current")
    }

    /// `block.count`: block devices, when the BLOCK group was asked for.
    pub fn block_count(&self) -> Option<u64> {
        self.params.u64("block.count")
    }
}

/// Statistics calls (`virConnectGetAllDomainStats`, `virDomainListGetStats`).
impl Client {
    /// `virConnectGetAllDomainStats`: the `stats` groups of every domain `flags` select
    /// (empty stats: every group the driver has; empty flags: every domain).
    ///
    /// ```no_run
    /// # async fn demo(client: banlieue_libvirt::Client) -> banlieue_libvirt::Result<()> {
    /// use banlieue_libvirt::flags::{ConnectGetAllDomainStatsFlags, DomainStatsTypes};
    ///
    /// let stats = client
    ///     .all_domain_stats(
    ///         DomainStatsTypes::STATE | DomainStatsTypes::CPU_TOTAL,
    ///         ConnectGetAllDomainStatsFlags::ACTIVE,
    ///     )
    ///     .await?;
    /// for s in stats {
    ///     println!("{}: {:?}, {:?} ns CPU", s.domain.name(), s.state(), s.cpu_time_ns());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn all_domain_stats(
        &self,
        stats: DomainStatsTypes,
        flags: ConnectGetAllDomainStatsFlags,
    ) -> Result<Vec<DomainStats>> {
        self.get_all_domain_stats(Vec::new(), stats, flags).await
    }

    /// `virDomainListGetStats`: [`Client::all_domain_stats`] for the given domains only (the
    /// domain-selecting flags do not apply).
    pub async fn domain_list_stats(
        &self,
        domains: &[Domain],
        stats: DomainStatsTypes,
        flags: ConnectGetAllDomainStatsFlags,
    ) -> Result<Vec<DomainStats>> {
        let doms = domains.iter().map(|d| d.raw().clone()).collect();
        self.get_all_domain_stats(doms, stats, flags).await
    }

    async fn get_all_domain_stats(
        &self,
        doms: Vec<remote::RemoteNonnullDomain>,
        stats: DomainStatsTypes,
        flags: ConnectGetAllDomainStatsFlags,
    ) -> Result<Vec<DomainStats>> {
        let r = self
            .call::<rp::ConnectGetAllDomainStats>(&remote::RemoteConnectGetAllDomainStatsArgs {
                doms,
                stats: stats.bits(),
                flags: flags.bits(),
            })
            .await?;
        Ok(r.ret_stats
            .into_iter()
            .map(|record| DomainStats {
                domain: Domain::from_raw(self, record.dom),
                params: TypedParams::from_raw(record.params),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xdr::Xdr;

    #[test]
    fn values_widen_only_where_they_fit() {
        assert_eq!(TypedValue::Int(-1).as_u64(), None);
        assert_eq!(TypedValue::Int(7).as_u64(), Some(7));
        assert_eq!(TypedValue::ULLong(u64::MAX).as_i64(), None);
        assert_eq!(
            TypedValue::UInt(u32::MAX).as_i64(),
            Some(i64::from(u32::MAX))
        );
        assert_eq!(TypedValue::Double(0.5).as_u64(), None);
        assert_eq!(TypedValue::Boolean(true).as_u64(), None);
        assert_eq!(TypedValue::String("1".into()).as_u64(), None);
        assert_eq!(TypedValue::LLong(3).as_f64(), Some(3.0));
    }

    #[test]
    fn wire_params_round_trip_through_the_typed_form() {
        let raw = vec![
            RemoteTypedParam {
                field: "cputune.vcpupin0".into(),
                value: RemoteTypedParamValue::String("0-1".into()),
            },
            RemoteTypedParam {
                field: "cputune.cpu_shares".into(),
                value: RemoteTypedParamValue::Ullong(1024),
            },
            RemoteTypedParam {
                field: "enabled".into(),
                value: RemoteTypedParamValue::Boolean(1),
            },
        ];
        // Through the wire form of a message that carries parameters.
        let message = remote::RemoteDomainEventCallbackTunableMsg {
            callback_id: 1,
            dom: Default::default(),
            params: raw.clone(),
        };
        let bytes = message.to_bytes().expect("encodes");
        let decoded =
            remote::RemoteDomainEventCallbackTunableMsg::from_bytes(&bytes).expect("decodes");
        let params = TypedParams::from_raw(decoded.params);
        assert_eq!(params.str("cputune.vcpupin0"), Some("0-1"));
        assert_eq!(params.u64("cputune.cpu_shares"), Some(1024));
        assert_eq!(params.bool("enabled"), Some(true));
        assert_eq!(params.get("absent"), None);
        assert_eq!(
            params
                .prefixed("cputune.")
                .map(|(n, _)| n)
                .collect::<Vec<_>>(),
            ["vcpupin0", "cpu_shares"]
        );
        assert_eq!(params.into_raw(), raw);
    }
}
