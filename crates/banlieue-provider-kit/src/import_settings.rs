//! Where a ProviderClass's image imports run: read by the operator (which grants the import
//! ServiceAccount) and by a backend's image reconciler (which runs the Jobs).

use banlieue_api::ProviderClass;
use banlieue_api::names;

/// The PVC the build artifacts live on when the ProviderClass names none.
pub const DEFAULT_ARTIFACTS_CLAIM: &str = "banlieue-artifacts";

/// The import settings of a ProviderClass with their defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportSettings {
    pub namespace: String,
    /// `None`: one account per Provider ([`ImportSettings::account_for`]), which the operator
    /// creates.
    pub service_account: Option<String>,
    pub artifacts_claim: String,
}

impl ImportSettings {
    pub fn of(class: &ProviderClass) -> Self {
        let import = &class.spec.import;
        ImportSettings {
            namespace: import
                .namespace
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| names::DEFAULT_BUILD_NAMESPACE.to_owned()),
            service_account: import
                .service_account_name
                .clone()
                .filter(|n| !n.is_empty()),
            artifacts_claim: import
                .artifacts_claim_name
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| DEFAULT_ARTIFACTS_CLAIM.to_owned()),
        }
    }

    /// The ServiceAccount the import Jobs of `provider` (in `namespace`) run as: the class's
    /// `serviceAccountName` when it names one (then shared by the class's Providers, the
    /// administrator's choice), else the Provider's own, which the operator creates in the
    /// import namespace so that one Provider's import pod cannot read another's namespace.
    pub fn account_for(&self, namespace: &str, provider: &str) -> String {
        match &self.service_account {
            Some(shared) => shared.clone(),
            None => crate::workload_names::import_account_name(namespace, provider),
        }
    }
}
