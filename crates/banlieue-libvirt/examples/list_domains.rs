//! Lists the domains of a libvirt host with their state, like `virsh list --all`.
//!
//! ```text
//! cargo run -p banlieue-libvirt --example list_domains -- 'qemu+tls://HOST/system?pkipath=DIR'
//! ```
//!
//! `DIR` holds `cacert.pem`, `clientcert.pem` and `clientkey.pem`, as for virsh.

use std::path::PathBuf;

use banlieue_libvirt::flags::ConnectListAllDomainsFlags;
use banlieue_libvirt::{CaBundle, Client, ConnectUri, Identity};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let uri = std::env::args()
        .nth(1)
        .ok_or("usage: list_domains 'qemu+tls://HOST/system?pkipath=DIR'")?;
    let pki = PathBuf::from(
        ConnectUri::parse(&uri)?
            .pkipath
            .ok_or("the URI needs ?pkipath=DIR")?,
    );
    let identity = Identity::from_files(&pki.join("clientcert.pem"), &pki.join("clientkey.pem"))?;
    let ca = CaBundle::from_file(&pki.join("cacert.pem"))?;

    let client = Client::connect(&uri, &identity, &ca).await?;
    println!("{:>4}  {:<32}  STATE", "ID", "NAME");
    for dom in client
        .list_all_domains(ConnectListAllDomainsFlags::empty())
        .await?
    {
        let (state, _reason) = dom.get_state().await?;
        let id = if dom.id() < 0 {
            "-".to_string()
        } else {
            dom.id().to_string()
        };
        println!(
            "{id:>4}  {:<32}  {}",
            dom.name(),
            state.name().unwrap_or("unknown")
        );
    }
    client.close().await?;
    Ok(())
}
