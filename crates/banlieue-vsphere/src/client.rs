//! The async shell: HTTPS POSTs of the pure requests to `/sdk`, the session cookie, re-login
//! on an expired session, and the typed calls built on them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;

use crate::error::{Error, Fault, Result};
use crate::methods;
use crate::moref::ManagedObjectRef;
use crate::property::{
    ObjectContent, PropertyFilterSpec, PropertyValue, RetrieveResult, UpdateSet,
};
use crate::soap::{Request, parse_response};
use crate::types::{
    CLUSTER_PATHS, CloneSpec, Cluster, Datacenter, ReconfigSpec, ServiceContent, TaskInfo,
    TaskState, UserSession, VM_INFO_PATHS, VmInfo,
};
use crate::xml::Element;

/// The largest response body read; a bigger one is refused, not buffered.
pub const BODY_LIMIT: usize = 16 << 20;
/// The newest vim25 version this client was written against: the SOAPAction names the
/// older of this and the server's `apiVersion`.
pub const CLIENT_API_VERSION: &str = "8.0.3.0";
/// The session cookie vim25 servers set at login.
pub const SESSION_COOKIE: &str = "vmware_soap_session";
/// How long one call may take (a `WaitForUpdatesEx` gets its wait on top).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How many objects one `RetrievePropertiesEx` page may hold, and how many in all.
const PAGE_SIZE: u32 = 1000;
const MAX_OBJECTS: usize = 1_000_000;
/// How often `wait_task` looks at a task: quickly at first, as most tasks are short.
const TASK_POLL_FIRST: Duration = Duration::from_millis(50);
const TASK_POLL_MAX: Duration = Duration::from_secs(1);

/// A user name and password for `SessionManager.Login`.
#[derive(Clone)]
pub struct Credentials {
    /// E.g. `administrator@vsphere.local`.
    pub username: String,
    /// Never printed by `Debug`.
    pub password: String,
}

impl Credentials {
    /// `username` and `password`.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Credentials {
            username: username.into(),
            password: password.into(),
        }
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// A logged-in vim25 session. Cheap to clone: clones share the session. A call that finds
/// the session gone (`NotAuthenticated`) logs in again once and retries; objects the old
/// session created (property collectors, filters, views) are gone with it.
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    url: String,
    credentials: Credentials,
    content: ServiceContent,
    soap_action: String,
    cookie: Mutex<Option<String>>,
    /// Bumped by every login, so concurrent calls that all saw `NotAuthenticated` log in once.
    login_generation: AtomicU64,
    relogin: tokio::sync::Mutex<()>,
}

/// Without the session cookie, which is as good as the password while the session lasts.
impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("url", &self.url)
            .field("credentials", &self.credentials)
            .field("soap_action", &self.soap_action)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to the SDK endpoint `url` (`https://vcenter.example/sdk`), trusting only the
    /// CA certificates in `ca_pem`, reads the service content and logs in.
    pub async fn connect(url: &str, ca_pem: &str, credentials: Credentials) -> Result<Client> {
        let http = http_client(ca_pem)?;
        let request = methods::retrieve_service_content();
        let response = post(
            &http,
            url,
            &soap_action(CLIENT_API_VERSION),
            None,
            &request,
            REQUEST_TIMEOUT,
        )
        .await?;
        let content = ServiceContent::from_element(returnval(&request, &response.element)?)?;
        let version = older_version(&content.about.api_version, CLIENT_API_VERSION);
        let client = Client {
            inner: Arc::new(Inner {
                http,
                url: url.to_owned(),
                credentials,
                soap_action: soap_action(version),
                content,
                cookie: Mutex::new(None),
                login_generation: AtomicU64::new(0),
                relogin: tokio::sync::Mutex::new(()),
            }),
        };
        client.login().await?;
        Ok(client)
    }

    /// The service content read at connect.
    pub fn service_content(&self) -> &ServiceContent {
        &self.inner.content
    }

    /// The vim25 version the calls name in their SOAPAction.
    pub fn api_version(&self) -> &str {
        self.inner
            .soap_action
            .strip_prefix("urn:vim25/")
            .unwrap_or(&self.inner.soap_action)
    }

    async fn login(&self) -> Result<UserSession> {
        self.set_cookie(None);
        let request = methods::login(
            &self.inner.content.session_manager,
            &self.inner.credentials.username,
            &self.inner.credentials.password,
        );
        let response = self.send(&request, REQUEST_TIMEOUT).await?;
        self.inner.login_generation.fetch_add(1, Ordering::SeqCst);
        UserSession::from_element(returnval(&request, &response)?)
    }

    /// Logs in again unless another call already did since `seen` was read.
    async fn relogin(&self, seen: u64) -> Result<()> {
        let _one_at_a_time = self.inner.relogin.lock().await;
        if self.inner.login_generation.load(Ordering::SeqCst) == seen {
            tracing::info!(url = %self.inner.url, "vSphere session expired; logging in again");
            self.login().await?;
        }
        Ok(())
    }

    /// Ends the session. Later calls log in again.
    pub async fn logout(&self) -> Result<()> {
        let request = methods::logout(&self.inner.content.session_manager);
        let result = self.send(&request, REQUEST_TIMEOUT).await.map(drop);
        self.set_cookie(None);
        result
    }

    /// The session as the server sees it (`SessionManager.currentSession`); `None` when the
    /// server says there is none.
    pub async fn current_session(&self) -> Result<Option<UserSession>> {
        let content = self
            .retrieve_one(&self.inner.content.session_manager, &["currentSession"])
            .await?;
        match content.get("currentSession") {
            Some(PropertyValue::Other(session)) => Ok(Some(UserSession::from_element(session)?)),
            Some(_) => Err(Error::malformed("currentSession", "not a UserSession")),
            None => Ok(None),
        }
    }

    /// Keeps the session from idling out: reads `currentSession` every `interval`, logging
    /// in again when the session is gone. Runs until the returned handle is dropped; the
    /// handle keeps the session's client alive. Intervals under 10 ms count as 10 ms.
    pub fn keep_alive(&self, interval: Duration) -> KeepAlive {
        let client = self.clone();
        let interval = interval.max(Duration::from_millis(10));
        let task = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                match client.current_session().await {
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        let seen = client.inner.login_generation.load(Ordering::SeqCst);
                        if let Err(error) = client.relogin(seen).await {
                            tracing::warn!(%error, "vSphere keep-alive: log in again");
                        }
                    }
                    Err(error) => tracing::warn!(%error, "vSphere keep-alive"),
                }
            }
        });
        KeepAlive { task }
    }

    /// Sends `request` in this session and returns the `<…Response>` element. A
    /// `NotAuthenticated` fault logs in again once and resends.
    pub async fn call(&self, request: &Request) -> Result<Element> {
        self.call_with_timeout(request, REQUEST_TIMEOUT).await
    }

    async fn call_with_timeout(&self, request: &Request, timeout: Duration) -> Result<Element> {
        let seen = self.inner.login_generation.load(Ordering::SeqCst);
        match self.send(request, timeout).await {
            Err(Error::Fault { fault, .. })
                if fault.is_not_authenticated()
                    && !matches!(request.method, "Login" | "Logout") =>
            {
                self.relogin(seen).await?;
                self.send(request, timeout).await
            }
            other => other,
        }
    }

    async fn send(&self, request: &Request, timeout: Duration) -> Result<Element> {
        let cookie = self.cookie();
        let started = Instant::now();
        let response = post(
            &self.inner.http,
            &self.inner.url,
            &self.inner.soap_action,
            cookie.as_deref(),
            request,
            timeout,
        )
        .await;
        tracing::debug!(method = request.method, elapsed = ?started.elapsed(), ok = response.is_ok(), "vim25 call");
        let response = response?;
        if let Some(cookie) = response.session_cookie {
            self.set_cookie(Some(cookie));
        }
        Ok(response.element)
    }

    fn cookie(&self) -> Option<String> {
        self.inner
            .cookie
            .lock()
            .map(|c| c.clone())
            .unwrap_or_else(|poisoned| poisoned.into_inner().clone())
    }

    fn set_cookie(&self, cookie: Option<String>) {
        let mut slot = self
            .inner
            .cookie
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *slot = cookie;
    }

    // ---- PropertyCollector ------------------------------------------------------------------

    /// Every object `spec` selects, with its properties, across all pages.
    pub async fn retrieve(&self, spec: &PropertyFilterSpec) -> Result<Vec<ObjectContent>> {
        let collector = &self.inner.content.property_collector;
        let request = methods::retrieve_properties_ex(collector, spec, Some(PAGE_SIZE));
        let response = self.call(&request).await?;
        let Some(page) = response.child("returnval") else {
            return Ok(Vec::new());
        };
        let mut page = RetrieveResult::from_element(page)?;
        let mut objects = std::mem::take(&mut page.objects);
        while let Some(token) = page.token.take() {
            if objects.len() > MAX_OBJECTS {
                return Err(Error::malformed(
                    "RetrievePropertiesEx",
                    format!("more than {MAX_OBJECTS} objects"),
                ));
            }
            let request = methods::continue_retrieve_properties_ex(collector, &token);
            let response = self.call(&request).await?;
            page = RetrieveResult::from_element(returnval(&request, &response)?)?;
            objects.append(&mut page.objects);
        }
        Ok(objects)
    }

    /// `paths` of one object. An unset property is absent from the result.
    pub async fn retrieve_one(
        &self,
        obj: &ManagedObjectRef,
        paths: &[&str],
    ) -> Result<ObjectContent> {
        let mut objects = self
            .retrieve(&PropertyFilterSpec::object(obj, paths))
            .await?;
        match objects.pop() {
            Some(content) if objects.is_empty() => Ok(content),
            _ => Err(Error::malformed(
                "RetrievePropertiesEx",
                format!("not exactly one object for {obj}"),
            )),
        }
    }

    /// A `ContainerView` of the objects of types `kinds` under `container`.
    pub async fn create_container_view(
        &self,
        container: &ManagedObjectRef,
        kinds: &[&str],
        recursive: bool,
    ) -> Result<ManagedObjectRef> {
        let request = methods::create_container_view(
            &self.inner.content.view_manager,
            container,
            kinds,
            recursive,
        );
        let response = self.call(&request).await?;
        ManagedObjectRef::from_element(returnval(&request, &response)?)
    }

    /// Destroys a view.
    pub async fn destroy_view(&self, view: &ManagedObjectRef) -> Result<()> {
        self.call(&methods::destroy_view(view)).await.map(drop)
    }

    /// `paths` of every object of type `kind` under `container` (recursively), through a
    /// container view that is destroyed afterwards.
    pub async fn objects_of(
        &self,
        container: &ManagedObjectRef,
        kind: &str,
        paths: &[&str],
    ) -> Result<Vec<ObjectContent>> {
        let view = self.create_container_view(container, &[kind], true).await?;
        let objects = self
            .retrieve(&PropertyFilterSpec::container_view(&view, kind, paths))
            .await;
        let destroyed = self.destroy_view(&view).await;
        let objects = objects?;
        destroyed?;
        Ok(objects)
    }

    /// A property collector of this session's own: its filters and updates are separate from
    /// every other collector's, so concurrent waits do not take each other's updates.
    pub async fn create_property_collector(&self) -> Result<ManagedObjectRef> {
        let request = methods::create_property_collector(&self.inner.content.property_collector);
        let response = self.call(&request).await?;
        ManagedObjectRef::from_element(returnval(&request, &response)?)
    }

    /// Destroys a collector made by [`create_property_collector`](Self::create_property_collector)
    /// and its filters.
    pub async fn destroy_property_collector(&self, collector: &ManagedObjectRef) -> Result<()> {
        self.call(&methods::destroy_property_collector(collector))
            .await
            .map(drop)
    }

    /// A filter on `collector`: its objects' changes come out of
    /// [`wait_for_updates`](Self::wait_for_updates).
    pub async fn create_filter(
        &self,
        collector: &ManagedObjectRef,
        spec: &PropertyFilterSpec,
        partial_updates: bool,
    ) -> Result<ManagedObjectRef> {
        let request = methods::create_filter(collector, spec, partial_updates);
        let response = self.call(&request).await?;
        ManagedObjectRef::from_element(returnval(&request, &response)?)
    }

    /// Destroys a filter.
    pub async fn destroy_filter(&self, filter: &ManagedObjectRef) -> Result<()> {
        self.call(&methods::destroy_property_filter(filter))
            .await
            .map(drop)
    }

    /// Waits up to `max_wait` (whole seconds) for changes on `collector`'s filters since
    /// `version` (`None`: the current state). `Ok(None)`: nothing changed in time.
    pub async fn wait_for_updates(
        &self,
        collector: &ManagedObjectRef,
        version: Option<&str>,
        max_wait: Duration,
    ) -> Result<Option<UpdateSet>> {
        let seconds = u32::try_from(max_wait.as_secs()).unwrap_or(u32::MAX);
        let request = methods::wait_for_updates_ex(collector, version, seconds);
        let response = self
            .call_with_timeout(&request, REQUEST_TIMEOUT.saturating_add(max_wait))
            .await?;
        response
            .child("returnval")
            .map(UpdateSet::from_element)
            .transpose()
    }

    // ---- inventory --------------------------------------------------------------------------

    /// Every datacenter, by name.
    pub async fn datacenters(&self) -> Result<Vec<Datacenter>> {
        let objects = self
            .objects_of(
                &self.inner.content.root_folder,
                "Datacenter",
                &["name", "vmFolder", "hostFolder"],
            )
            .await?;
        let mut datacenters = objects
            .iter()
            .map(Datacenter::from_content)
            .collect::<Result<Vec<_>>>()?;
        datacenters.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(datacenters)
    }

    /// The clusters in `datacenter`, by name.
    pub async fn clusters(&self, datacenter: &ManagedObjectRef) -> Result<Vec<Cluster>> {
        let objects = self
            .objects_of(datacenter, "ClusterComputeResource", CLUSTER_PATHS)
            .await?;
        let mut clusters = objects
            .iter()
            .map(Cluster::from_content)
            .collect::<Result<Vec<_>>>()?;
        clusters.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(clusters)
    }

    /// The object at an inventory path such as `DC0/vm/DC0_C0_RP0_VM0` or
    /// `DC0/host/DC0_C0`, if any.
    pub async fn find_by_inventory_path(&self, path: &str) -> Result<Option<ManagedObjectRef>> {
        let request = methods::find_by_inventory_path(&self.inner.content.search_index, path);
        let response = self.call(&request).await?;
        response
            .child("returnval")
            .map(ManagedObjectRef::from_element)
            .transpose()
    }

    /// The VM named `name` anywhere in the inventory; [`Error::Ambiguous`] if several are.
    /// Reads every VM's name: for a large inventory prefer
    /// [`find_by_inventory_path`](Self::find_by_inventory_path).
    pub async fn vm_by_name(&self, name: &str) -> Result<Option<ManagedObjectRef>> {
        let objects = self
            .objects_of(&self.inner.content.root_folder, "VirtualMachine", &["name"])
            .await?;
        let mut matching: Vec<_> = objects
            .into_iter()
            .filter(|o| o.get("name").and_then(PropertyValue::text) == Some(name))
            .map(|o| o.obj)
            .collect();
        match matching.len() {
            0 | 1 => Ok(matching.pop()),
            count => Err(Error::Ambiguous {
                name: name.to_owned(),
                count,
            }),
        }
    }

    /// Name, power state, extraConfig, guest NICs and vTPM certificates of `vm`.
    pub async fn vm_info(&self, vm: &ManagedObjectRef) -> Result<VmInfo> {
        VmInfo::from_content(&self.retrieve_one(vm, VM_INFO_PATHS).await?)
    }

    /// Whether `vm` is a template (`config.template`): what an administrator made a template
    /// is what clones may start from.
    pub async fn is_template(&self, vm: &ManagedObjectRef) -> Result<bool> {
        let content = self.retrieve_one(vm, &["config.template"]).await?;
        match content.get("config.template") {
            Some(PropertyValue::Bool(template)) => Ok(*template),
            // No config (an inaccessible VM) is no template.
            None => Ok(false),
            Some(_) => Err(Error::malformed(
                "VirtualMachine",
                "config.template is not a boolean",
            )),
        }
    }

    /// Makes `vm` a template (`MarkAsTemplate`, immediate: no task).
    pub async fn mark_as_template(&self, vm: &ManagedObjectRef) -> Result<()> {
        self.call(&methods::mark_as_template(vm)).await?;
        Ok(())
    }

    // ---- VM operations (each returns its Task) ----------------------------------------------

    /// Starts cloning `template` (a VM or template) as `spec` says; the task's result is the
    /// new VM.
    pub async fn clone_vm(
        &self,
        template: &ManagedObjectRef,
        spec: &CloneSpec,
    ) -> Result<ManagedObjectRef> {
        self.start_task(&methods::clone_vm_task(template, spec))
            .await
    }

    /// Starts reconfiguring `vm` (CPUs, memory, extraConfig).
    pub async fn reconfigure_vm(
        &self,
        vm: &ManagedObjectRef,
        spec: &ReconfigSpec,
    ) -> Result<ManagedObjectRef> {
        self.start_task(&methods::reconfig_vm_task(vm, spec)).await
    }

    /// Starts powering `vm` on.
    pub async fn power_on_vm(&self, vm: &ManagedObjectRef) -> Result<ManagedObjectRef> {
        self.start_task(&methods::power_on_vm_task(vm)).await
    }

    /// Starts powering `vm` off (hard).
    pub async fn power_off_vm(&self, vm: &ManagedObjectRef) -> Result<ManagedObjectRef> {
        self.start_task(&methods::power_off_vm_task(vm)).await
    }

    /// Starts suspending `vm` (powered on): its memory is written to its datastore;
    /// [`power_on_vm`](Self::power_on_vm) resumes it.
    pub async fn suspend_vm(&self, vm: &ManagedObjectRef) -> Result<ManagedObjectRef> {
        self.start_task(&methods::suspend_vm_task(vm)).await
    }

    /// Starts destroying `entity` (a VM: its files too).
    pub async fn destroy(&self, entity: &ManagedObjectRef) -> Result<ManagedObjectRef> {
        self.start_task(&methods::destroy_task(entity)).await
    }

    async fn start_task(&self, request: &Request) -> Result<ManagedObjectRef> {
        let response = self.call(request).await?;
        ManagedObjectRef::from_element(returnval(request, &response)?)
    }

    /// A task's state, result and error.
    pub async fn task_info(&self, task: &ManagedObjectRef) -> Result<TaskInfo> {
        let content = self.retrieve_one(task, &["info"]).await?;
        match content.get("info") {
            Some(PropertyValue::Other(info)) => TaskInfo::from_element(info),
            _ => Err(Error::malformed("Task", format!("{task} has no TaskInfo"))),
        }
    }

    /// Waits until `task` ends: its result reference on success (the new VM of a clone,
    /// `None` for tasks without one), [`Error::Task`] with the fault on error. Polls the task
    /// (fast at first, then every second) and has no deadline of its own: wrap it in
    /// `tokio::time::timeout` to bound it.
    pub async fn wait_task(&self, task: &ManagedObjectRef) -> Result<Option<ManagedObjectRef>> {
        let mut delay = TASK_POLL_FIRST;
        loop {
            let info = self.task_info(task).await?;
            match info.state {
                TaskState::Success => {
                    return Ok(info
                        .result
                        .as_ref()
                        .and_then(PropertyValue::as_moref)
                        .cloned());
                }
                TaskState::Error => {
                    return Err(Error::Task {
                        task: task.clone(),
                        fault: info.error.unwrap_or_else(|| Fault {
                            kind: "MethodFault".into(),
                            message: "the task failed without saying why".into(),
                        }),
                    });
                }
                TaskState::Queued | TaskState::Running | TaskState::Other(_) => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(TASK_POLL_MAX);
                }
            }
        }
    }
}

/// Keeps a session alive (see [`Client::keep_alive`]); stops when dropped.
#[derive(Debug)]
pub struct KeepAlive {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What one POST returned.
struct Response {
    element: Element,
    session_cookie: Option<String>,
}

async fn post(
    http: &reqwest::Client,
    url: &str,
    soap_action: &str,
    cookie: Option<&str>,
    request: &Request,
    timeout: Duration,
) -> Result<Response> {
    let http_error = |source| Error::Http {
        method: request.method,
        url: url.to_owned(),
        source,
    };
    let mut builder = http
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "text/xml; charset=utf-8")
        .header("SOAPAction", soap_action)
        .timeout(timeout)
        .body(request.body.clone());
    if let Some(cookie) = cookie {
        builder = builder.header(reqwest::header::COOKIE, cookie);
    }
    let mut response = builder.send().await.map_err(http_error)?;
    let session_cookie = response
        .headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .find_map(session_cookie);
    let status = response.status().as_u16();
    if response
        .content_length()
        .is_some_and(|len| len > BODY_LIMIT as u64)
    {
        return Err(Error::TooLarge {
            method: request.method,
            limit: BODY_LIMIT,
        });
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(http_error)? {
        if body.len() + chunk.len() > BODY_LIMIT {
            return Err(Error::TooLarge {
                method: request.method,
                limit: BODY_LIMIT,
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Response {
        element: parse_response(request.method, status, &body)?,
        session_cookie,
    })
}

/// `vmware_soap_session=…` from a `Set-Cookie` value, ready for a `Cookie` header.
fn session_cookie(set_cookie: &str) -> Option<String> {
    let pair = set_cookie.split(';').next()?.trim();
    let (name, value) = pair.split_once('=')?;
    (name.trim() == SESSION_COOKIE && !value.is_empty()).then(|| pair.to_owned())
}

fn http_client(ca_pem: &str) -> Result<reqwest::Client> {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let certificate = certificate.map_err(|e| Error::CaBundle(e.to_string()))?;
        roots
            .add(certificate)
            .map_err(|e| Error::CaBundle(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(Error::CaBundle("it holds no certificate".into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::CaBundle(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .redirect(reqwest::redirect::Policy::none())
        // vCenter is reached directly; a proxy from the environment would see the session.
        .no_proxy()
        .connect_timeout(CONNECT_TIMEOUT)
        .build()
        .map_err(Error::HttpClient)
}

fn soap_action(version: &str) -> String {
    format!("urn:vim25/{version}")
}

/// The older of two dotted versions (`6.7.3` < `8.0.1.0`); a part that is not a number
/// counts as 0.
fn older_version<'a>(a: &'a str, b: &'a str) -> &'a str {
    let parts = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    if parts(a) <= parts(b) { a } else { b }
}

/// The `returnval` of a response whose method always returns one.
fn returnval<'a>(request: &Request, response: &'a Element) -> Result<&'a Element> {
    response
        .child("returnval")
        .ok_or_else(|| Error::malformed(format!("{} response", request.method), "no <returnval>"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_cookie_is_picked_from_set_cookie() {
        assert_eq!(
            session_cookie("vmware_soap_session=\"52ab\"; Path=/; HttpOnly; Secure;").as_deref(),
            Some("vmware_soap_session=\"52ab\"")
        );
        assert_eq!(session_cookie("other=1; Path=/"), None);
        assert_eq!(session_cookie("vmware_soap_session="), None);
        assert_eq!(session_cookie(""), None);
    }

    #[test]
    fn the_soap_action_names_the_older_version() {
        assert_eq!(older_version("6.5", CLIENT_API_VERSION), "6.5");
        assert_eq!(
            older_version("9.0.0.0", CLIENT_API_VERSION),
            CLIENT_API_VERSION
        );
        assert_eq!(older_version("8.0.3.0", "8.0.3.0"), "8.0.3.0");
        assert_eq!(older_version("8.0.10.0", "8.0.3.0"), "8.0.3.0");
    }

    #[test]
    fn a_ca_bundle_without_certificates_is_refused() {
        assert!(matches!(http_client(""), Err(Error::CaBundle(_))));
        assert!(matches!(
            http_client("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"),
            Err(Error::CaBundle(_))
        ));
    }
}
