//! The objects `banlieue-dev up` creates, as pure values: one Provider for the local libvirtd,
//! a tiny BackingFile image, a small class, a pool of one and a claim by `alice`.

use std::collections::BTreeMap;

use banlieue_api::names::SYSTEM_NAMESPACE;
use banlieue_api::{
    ClaimSubject, Firmware, ImageSource, ImageSourceKind, InstallMode, KeySelector,
    LocalObjectReference, NetworkClassMapping, NetworkTarget, PoolReadiness, PoolUpdateStrategy,
    PoolUpdateType, Provider, ProviderCapabilities, ProviderClass, ProviderClassSpec,
    ProviderConnection, ProviderSpec, StorageClassMapping, StorageTarget, TemplateMetadata,
    VMClass, VMClassSpec, VMImage, VMImageSpec, ValueOrSource, VirtualMachineClaim,
    VirtualMachineClaimSpec, VirtualMachinePool, VirtualMachinePoolSpec, VirtualMachineSpec,
    VirtualMachineTemplate,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;

/// Names of everything dev up creates, in one place so the summary and the tests agree.
pub const PROVIDER_CLASS: &str = "libvirt";
pub const PROVIDER: &str = "local";
pub const CREDENTIALS_SECRET: &str = "local-libvirt-creds";
pub const CA_CONFIGMAP: &str = "local-libvirt-ca";
pub const STORAGE_POOL: &str = "default";
pub const NETWORK: &str = "banlieue-dev";
pub const STORAGE_CLASS: &str = "standard";
pub const NETWORK_CLASS: &str = "isolated";
pub const IMAGE: &str = "dev-image";
pub const IMAGE_VOLUME: &str = "dev-image.raw";
pub const CLASS: &str = "small";
/// `--guest debian`: the test guest image (scripts/guest-image) as a BackingFile volume, and a
/// class with EFI and a vTPM, which that image boots with.
pub const GUEST_IMAGE: &str = "debian-guest";
pub const GUEST_IMAGE_VOLUME: &str = "debian-guest.qcow2";
pub const GUEST_CLASS: &str = "debian-tpm";
/// The test guest image as a Deferred install medium (`scripts/guest-image --installer`).
pub const INSTALLER_IMAGE: &str = "debian-installer";
pub const INSTALLER_VOLUME: &str = "debian-installer.iso";
/// The ConfigMap holding this host's swtpm-localca issuer and root, which the Provider names
/// as its `ekTrustBundle`.
pub const EK_TRUST_CONFIGMAP: &str = "swtpm-localca-issuers";
pub const POOL: &str = "sandbox-pool";
/// How long the `--guest debian` pool's member may take to reach GuestReady before the pool
/// replaces it: a boot takes about a minute alone and up to four under load here.
pub const GUEST_STARTUP_DEADLINE_SECONDS: i64 = 240;
pub const CLAIM: &str = "sandbox-for-alice";
/// The user the claim is created as; the admission policy checks the subject against it.
pub const CLAIMANT: &str = "alice";
/// The one issuer the dev policy allows.
pub const ISSUER: &str = "https://issuer.dev.banlieue.invalid";
pub const CLAIM_POLICY_CONFIGMAP: &str = "banlieue-claim-subject-policy";
pub const CLAIMANT_ROLE: &str = "dev-claimant";

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(SYSTEM_NAMESPACE.to_owned()),
        ..ObjectMeta::default()
    }
}

/// The client identity libvirtd trusts, as the Secret the Provider names.
pub fn credentials_secret(cert_pem: &[u8], key_pem: &[u8]) -> Secret {
    let data = BTreeMap::from([
        ("tls.crt".to_owned(), ByteString(cert_pem.to_vec())),
        ("tls.key".to_owned(), ByteString(key_pem.to_vec())),
    ]);
    Secret {
        metadata: meta(CREDENTIALS_SECRET),
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Secret::default()
    }
}

/// The CA that signed libvirtd's certificate.
pub fn ca_configmap(ca_pem: &str) -> ConfigMap {
    ConfigMap {
        metadata: meta(CA_CONFIGMAP),
        data: Some(BTreeMap::from([("ca.crt".to_owned(), ca_pem.to_owned())])),
        ..ConfigMap::default()
    }
}

/// The image the in-process roles' ProviderClass names: no pod ever runs it (the workload runs
/// in this process), but the operator still writes its Deployment.
pub const DEV_IMAGE: &str = "banlieue:dev";

/// The workload policy's parameters (`deploy/admission/workload-images.yaml`): the images
/// `dev` names, the in-process one and the deployed one; each Provider imports as its own
/// account.
pub fn workload_images_configmap() -> ConfigMap {
    ConfigMap {
        metadata: meta("banlieue-workload-images"),
        data: Some(BTreeMap::from([
            (
                "images".to_owned(),
                format!("{DEV_IMAGE}\n{}\n", banlieue::bootstrap::DEFAULT_IMAGE),
            ),
            ("importAccounts".to_owned(), String::new()),
        ])),
        ..ConfigMap::default()
    }
}

/// The claim-subject policy's parameters: the dev issuer, no brokers.
pub fn claim_policy_configmap() -> ConfigMap {
    ConfigMap {
        metadata: meta(CLAIM_POLICY_CONFIGMAP),
        data: Some(BTreeMap::from([
            ("issuers".to_owned(), ISSUER.to_owned()),
            ("brokers".to_owned(), String::new()),
        ])),
        ..ConfigMap::default()
    }
}

/// Lets the claimant create, read, release and patch claims in the system namespace (a patch
/// writes her challenge, `spec.handover`; admission keeps the rest of a claim as created),
/// nothing else.
pub fn claimant_rbac() -> (Role, RoleBinding) {
    let role = Role {
        metadata: meta(CLAIMANT_ROLE),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["banlieue.io".into()]),
            resources: Some(vec!["virtualmachineclaims".into()]),
            verbs: ["create", "get", "list", "watch", "patch", "delete"]
                .map(String::from)
                .to_vec(),
            ..PolicyRule::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: meta(CLAIMANT_ROLE),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: CLAIMANT_ROLE.into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: CLAIMANT.into(),
            namespace: None,
        }]),
    };
    (role, binding)
}

/// The ProviderClass. Its workload never runs here (no kubelet): dev up runs the provider in
/// process, so the image is only a name.
pub fn provider_class(image: &str) -> ProviderClass {
    ProviderClass::new(
        PROVIDER_CLASS,
        ProviderClassSpec {
            image: image.to_owned(),
            command: vec!["/banlieue".into()],
            args: Vec::new(),
            machine_kind: Default::default(),
            // The libvirt class's rules (examples/09), which the shipped ClusterRole
            // banlieue-provider-class-libvirt grants in the build namespace.
            additional_rules: vec![
                PolicyRule {
                    api_groups: Some(vec!["batch".into()]),
                    resources: Some(vec!["jobs".into()]),
                    verbs: ["create", "get", "list", "watch", "delete"]
                        .map(String::from)
                        .to_vec(),
                    ..PolicyRule::default()
                },
                PolicyRule {
                    api_groups: Some(vec![String::new()]),
                    resources: Some(vec!["serviceaccounts".into()]),
                    verbs: vec!["get".into()],
                    ..PolicyRule::default()
                },
            ],
            import: Default::default(),
            pod: Default::default(),
        },
    )
}

/// The ProviderClass of `dev up --deployed`: the class above running banlieue's `image` on the
/// node, its guests of `domain_type` (`qemu` where KVM is not usable).
pub fn deployed_provider_class(image: &str, domain_type: &str) -> ProviderClass {
    let mut class = provider_class(image);
    class.spec.pod.env = vec![k8s_openapi::api::core::v1::EnvVar {
        name: banlieue_provider_libvirt::domain_type::DOMAIN_TYPE_ENV.to_owned(),
        value: Some(domain_type.to_owned()),
        ..Default::default()
    }];
    class
}

/// The Provider for the local libvirtd at `endpoint`.
pub fn provider(endpoint: &str) -> Provider {
    let mut provider = Provider::new(
        PROVIDER,
        ProviderSpec {
            provider_class_ref: LocalObjectReference::new(PROVIDER_CLASS),
            connection: ProviderConnection {
                endpoint: endpoint.to_owned(),
                credentials_ref: LocalObjectReference::new(CREDENTIALS_SECRET),
                ca_bundle: ValueOrSource {
                    config_map_ref: Some(KeySelector {
                        name: CA_CONFIGMAP.into(),
                        key: "ca.crt".into(),
                    }),
                    ..ValueOrSource::default()
                },
            },
            capabilities: ProviderCapabilities {
                storage_classes: vec![StorageClassMapping {
                    name: STORAGE_CLASS.into(),
                    target: StorageTarget {
                        pool: STORAGE_POOL.into(),
                    },
                }],
                network_classes: vec![NetworkClassMapping {
                    name: NETWORK_CLASS.into(),
                    target: NetworkTarget {
                        network: NETWORK.into(),
                    },
                }],
                // swtpm is installed beside libvirtd here, so guests may have a vTPM.
                features: vec!["vtpm".into()],
                // The volumes dev up uploads, and nothing else of the pool.
                backing_file_volumes: [IMAGE_VOLUME, GUEST_IMAGE_VOLUME, INSTALLER_VOLUME]
                    .map(String::from)
                    .to_vec(),
                memory_overcommit_percent: None,
                vsphere: None,
                resume_reserve: None,
                save_storage: None,
            },
            attestation: Some(banlieue_api::ProviderAttestation {
                ek_trust_bundle: Some(ValueOrSource {
                    inline: None,
                    config_map_ref: Some(KeySelector {
                        name: EK_TRUST_CONFIGMAP.into(),
                        key: "ca.crt".into(),
                    }),
                    secret_ref: None,
                }),
            }),
        },
    );
    provider.metadata.namespace = Some(SYSTEM_NAMESPACE.into());
    provider
}

/// A BackingFile image: the raw volume dev up writes into the pool.
pub fn image() -> VMImage {
    let mut image = VMImage::new(
        IMAGE,
        VMImageSpec {
            install_mode: InstallMode::Immediate,
            revision: Some("1".into()),
            disk_size: Some(Quantity("1Gi".into())),
            sources: vec![ImageSource {
                provider_class: PROVIDER_CLASS.into(),
                kind: ImageSourceKind::BackingFile,
                url: None,
                volume: Some(IMAGE_VOLUME.into()),
                template: None,
                pull_secret_name: None,
                ca_config_map_name: None,
                plain_http: false,
                token_realm_hosts: Vec::new(),
            }],
        },
    );
    image.metadata.namespace = Some(SYSTEM_NAMESPACE.into());
    image
}

/// The test guest image, uploaded by dev up as a qcow2 volume: overlays name it as their
/// backing file with that format.
pub fn guest_image() -> VMImage {
    let mut image = image();
    image.metadata.name = Some(GUEST_IMAGE.into());
    image.spec.disk_size = Some(Quantity("4Gi".into()));
    image.spec.sources[0].volume = Some(GUEST_IMAGE_VOLUME.into());
    image
}

/// The installer CD as a Deferred image: each machine boots it beside an empty 4Gi disk, and
/// it writes the test guest onto that disk and reboots into it.
pub fn installer_image() -> VMImage {
    let mut image = image();
    image.metadata.name = Some(INSTALLER_IMAGE.into());
    image.spec.install_mode = InstallMode::Deferred;
    image.spec.disk_size = Some(Quantity("4Gi".into()));
    image.spec.sources[0].volume = Some(INSTALLER_VOLUME.into());
    image
}

/// What the test guest boots with (scripts/guest-image): EFI, and a vTPM whose EK
/// certificates the claim carries. One vCPU: under TCG on a busy two-core host, a second vCPU
/// starved of host time stalls the guest's kernel (RCU stalls, a vCPU whose timer never fires)
/// until its boot hangs, and it only adds load beside the other guests.
pub fn guest_class() -> VMClass {
    let mut class = VMClass::new(
        GUEST_CLASS,
        VMClassSpec {
            cpu: 1,
            memory: Quantity("1Gi".into()),
            firmware: Firmware::Efi,
            tpm_enabled: true,
            secure_boot: false,
            disk_size: None,
            egress: None,
        },
    );
    class.metadata.namespace = Some(SYSTEM_NAMESPACE.into());
    class
}

/// cloud-init user-data for guests on the isolated network, which has no DHCP: each guest
/// gives its first NIC an address in 198.18.0.0/15 (RFC 2544's benchmarking range) made of the
/// last two bytes of its MAC, so members of one pool differ and the address is predictable
/// from the domain's XML.
pub const GUEST_USER_DATA: &str = r#"#cloud-config
hostname: sandbox
bootcmd:
  - [sh, -c, 'i=$(ls /sys/class/net | grep -v "^lo$" | head -n 1); set -- $(tr ":" " " < /sys/class/net/$i/address); ip link set "$i" up; ip addr replace "198.18.$((0x$5)).$((0x$6))/15" dev "$i"']
"#;

/// The address [`GUEST_USER_DATA`] gives a guest whose NIC has `mac`.
pub fn guest_address(mac: &str) -> Option<String> {
    let bytes: Vec<u8> = mac
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).ok())
        .collect::<Option<_>>()?;
    match bytes.as_slice() {
        [.., a, b] if bytes.len() == 6 => Some(format!("198.18.{a}.{b}")),
        _ => None,
    }
}

/// A pool of one warm member of the test guest, available once the guest reports `ready`.
pub fn guest_pool() -> VirtualMachinePool {
    let mut pool = pool();
    let spec = &mut pool.spec.template.spec;
    spec.class_ref = LocalObjectReference::new(GUEST_CLASS);
    spec.image_ref = LocalObjectReference::new(GUEST_IMAGE);
    spec.user_data = Some(GUEST_USER_DATA.into());
    pool.spec.readiness = PoolReadiness::GuestReady;
    // A TCG guest hangs in its boot now and then (its agent never connects); the pool replaces
    // it as a user's pool would, well within `--timeout-seconds`' default of 600.
    pool.spec.startup_deadline_seconds = Some(GUEST_STARTUP_DEADLINE_SECONDS);
    pool
}

/// This host's swtpm-localca issuer and root certificates as the `ekTrustBundle` ConfigMap.
pub fn ek_trust_configmap(pem: &str) -> ConfigMap {
    ConfigMap {
        metadata: meta(EK_TRUST_CONFIGMAP),
        data: Some(BTreeMap::from([("ca.crt".to_owned(), pem.to_owned())])),
        ..ConfigMap::default()
    }
}

/// One vCPU and little memory: the guest has no OS to boot, it only has to run under TCG.
pub fn class() -> VMClass {
    let mut class = VMClass::new(
        CLASS,
        VMClassSpec {
            cpu: 1,
            memory: Quantity("128Mi".into()),
            firmware: Firmware::Bios,
            tpm_enabled: false,
            secure_boot: false,
            disk_size: None,
            egress: None,
        },
    );
    class.metadata.namespace = Some(SYSTEM_NAMESPACE.into());
    class
}

/// A pool of one warm member.
pub fn pool() -> VirtualMachinePool {
    let mut pool = VirtualMachinePool::new(
        POOL,
        VirtualMachinePoolSpec {
            replicas: 1,
            template: VirtualMachineTemplate {
                metadata: TemplateMetadata::default(),
                spec: VirtualMachineSpec {
                    class_ref: LocalObjectReference::new(CLASS),
                    image_ref: LocalObjectReference::new(IMAGE),
                    storage_class_name: STORAGE_CLASS.into(),
                    network_class_name: NETWORK_CLASS.into(),
                    user_data: Some("#cloud-config\nhostname: sandbox\n".into()),
                    user_data_secret_ref: None,
                    standby: None,
                    access: None,
                    handover: None,
                },
            },
            readiness: PoolReadiness::InfrastructureReady,
            max_idle_seconds: None,
            update_strategy: PoolUpdateStrategy {
                type_: PoolUpdateType::Replace,
                max_surge: 1,
            },
            startup_deadline_seconds: None,
            max_provisioning: None,
            standby: None,
            claimants: None,
            max_claims_per_subject: None,
        },
    );
    pool.metadata.namespace = Some(SYSTEM_NAMESPACE.into());
    pool
}

/// The claim, naming the claimant as its subject (the admission policy insists).
pub fn claim() -> VirtualMachineClaim {
    let mut claim = VirtualMachineClaim::new(
        CLAIM,
        VirtualMachineClaimSpec {
            pool_ref: LocalObjectReference::new(POOL),
            subject: ClaimSubject {
                issuer: ISSUER.into(),
                id: CLAIMANT.into(),
            },
            ttl_seconds: 3600,
            access: None,
            handover: None,
        },
    );
    claim.metadata.namespace = Some(SYSTEM_NAMESPACE.into());
    claim
}

/// The dir storage pool at `path`.
pub fn storage_pool_xml(path: &str) -> String {
    let path = quick_xml::escape::escape(path);
    format!(
        "<pool type='dir'><name>{STORAGE_POOL}</name><target><path>{path}</path></target></pool>"
    )
}

/// An isolated network: a bridge with no address, no DHCP and no DNS, so nothing listens
/// anywhere but loopback.
pub fn network_xml(bridge: &str) -> String {
    let bridge = quick_xml::escape::escape(bridge);
    format!(
        "<network><name>{NETWORK}</name><bridge name='{bridge}' stp='off'/><dns enable='no'/></network>"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_claim_names_its_creator_and_an_allowed_issuer() {
        let claim = claim();
        assert_eq!(claim.spec.subject.id, CLAIMANT);
        let policy = claim_policy_configmap();
        assert_eq!(policy.data.unwrap()["issuers"], claim.spec.subject.issuer);
    }

    #[test]
    fn the_pool_template_matches_the_provider_declaration() {
        let provider = provider("qemu+tls://127.0.0.1:1/system");
        let pool = pool();
        let caps = &provider.spec.capabilities;
        let template = &pool.spec.template.spec;
        assert!(
            caps.storage_classes
                .iter()
                .any(|s| s.name == template.storage_class_name)
        );
        assert!(
            caps.network_classes
                .iter()
                .any(|n| n.name == template.network_class_name)
        );
        assert_eq!(template.image_ref.name, IMAGE);
        assert_eq!(
            image().spec.sources[0].volume.as_deref(),
            Some(IMAGE_VOLUME)
        );
    }

    #[test]
    fn the_guest_address_comes_from_the_mac() {
        assert_eq!(
            guest_address("52:54:00:ab:01:ff").as_deref(),
            Some("198.18.1.255")
        );
        assert_eq!(guest_address("52:54:00:ab:01"), None);
        assert_eq!(guest_address("52:54:00:ab:01:zz"), None);
    }

    #[test]
    fn pool_paths_are_escaped() {
        assert_eq!(
            storage_pool_xml("/a'b<c"),
            "<pool type='dir'><name>default</name><target><path>/a&apos;b&lt;c</path></target></pool>"
        );
    }
}
