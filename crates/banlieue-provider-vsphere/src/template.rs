//! Which templates a Provider clones. A VMImage's `Template` source and a VSphereMachine's
//! `spec.template` are written by users of a namespace; the Provider's account sees far more of
//! vCenter than they should. So a template must lie under a folder the administrator declared
//! (`capabilities.vsphere.templateFolders`) and be a template in vCenter (`config.template`),
//! never just any VM the account can read.

use banlieue_api::Provider;
use banlieue_api::vsphere::template_folder_refusal;
use banlieue_vsphere::{Client, ManagedObjectRef};

/// What vCenter and the Provider's declaration say of a template path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplateSight {
    /// A template under a declared folder: it may be cloned.
    Template(ManagedObjectRef),
    /// Nothing at that path.
    Missing,
    /// Not to be cloned; the text says why.
    Refused(String),
}

/// The template folders `provider` declares.
pub fn declared_folders(provider: &Provider) -> &[String] {
    provider
        .spec
        .capabilities
        .vsphere
        .as_ref()
        .map(|v| v.template_folders.as_slice())
        .unwrap_or_default()
}

/// Looks `template` up for `provider`: the declared folders first (vCenter is not asked about a
/// path outside them), then the object at the path, then whether it is a template.
pub async fn look(
    client: &Client,
    provider: &Provider,
    template: &str,
) -> Result<TemplateSight, banlieue_vsphere::Error> {
    if let Some(why) = template_folder_refusal(template, declared_folders(provider)) {
        return Ok(TemplateSight::Refused(why));
    }
    let Some(found) = client.find_by_inventory_path(template).await? else {
        return Ok(TemplateSight::Missing);
    };
    if found.kind != "VirtualMachine" {
        return Ok(TemplateSight::Refused(format!(
            "{template} is a {}, not a template",
            found.kind
        )));
    }
    Ok(if client.is_template(&found).await? {
        TemplateSight::Template(found)
    } else {
        TemplateSight::Refused(format!(
            "{template} is a VM, not a template (config.template is false): only templates are \
             cloned"
        ))
    })
}
