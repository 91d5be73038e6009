//! The shared reflector caches every decision reads, and the trigger streams the controllers
//! are driven by, fed from those same caches.
//!
//! A trigger is sent only after its cache holds the change that caused it, so a reconcile never
//! reads a cache older than its trigger. With a watch of its own per controller, a member's
//! update could wake the pool before the cache the pool decides from had it; the pool, seeing
//! nothing new, would then wait for its next resync.

use std::fmt::Debug;
use std::future::Future;

use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;

use crate::context::Readiness;

/// What a cache sends each subscriber: every object it applied (added, changed, deleted or
/// listed again), once the cache holds the change.
pub(crate) type Triggers<K> = mpsc::UnboundedReceiver<Result<K, watcher::Error>>;

/// A cache of `api`'s objects, `N` trigger streams fed from it, and the future that keeps it
/// filled. The cache registers as `name` in `readiness` and marks it once it holds its initial
/// list.
pub(crate) fn cache<K, const N: usize>(
    api: Api<K>,
    readiness: &Readiness,
    name: &'static str,
) -> (
    Store<K>,
    [Triggers<K>; N],
    impl Future<Output = ()> + Send + 'static,
)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let events = watcher(api, watcher::Config::default()).default_backoff();
    shared_cache(events, (), readiness, name)
}

/// [`cache`] for objects known only at run time (a machine kind): `api` and `resource` name
/// the same resource.
pub(crate) fn dynamic_cache<const N: usize>(
    api: Api<DynamicObject>,
    resource: ApiResource,
    readiness: &Readiness,
    name: &'static str,
) -> (
    Store<DynamicObject>,
    [Triggers<DynamicObject>; N],
    impl Future<Output = ()> + Send + 'static,
) {
    let events = watcher(api, watcher::Config::default()).default_backoff();
    shared_cache(events, resource, readiness, name)
}

/// No decision reads `metadata.managedFields`, and it is most of a cached object's memory (a
/// tree of every field each manager wrote): dropped before the object is cached or sent.
fn forget_managed_fields<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// [`cache`] over any stream of watch events. The trigger streams are unbounded so a busy
/// controller never holds back the cache the others read; each holds at most the objects that
/// changed since that controller last looked.
fn shared_cache<K, S, const N: usize>(
    events: S,
    dyntype: K::DynamicType,
    readiness: &Readiness,
    name: &'static str,
) -> (
    Store<K>,
    [Triggers<K>; N],
    impl Future<Output = ()> + Send + 'static,
)
where
    K: Resource + Clone + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash + Send + Sync,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    readiness.register(name);
    let writer = reflector::store::Writer::new(dyntype);
    let reader = writer.as_reader();
    let readiness = readiness.clone();
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..N).map(|_| mpsc::unbounded()).unzip();
    let Ok(receivers) = <[Triggers<K>; N]>::try_from(receivers) else {
        unreachable!("exactly N receivers were made")
    };
    let mut fanout = Fanout::new(senders);
    let mut send = move |object: &K| fanout.send(object);
    // The reflector applies each event to the store before yielding it, except a (re)list:
    // its objects replace the store's only at InitDone, so they are held until then. Sending
    // from here is what orders every trigger after its cache update.
    let mut listed = Vec::new();
    let events = events.modify(forget_managed_fields);
    let task = reflector::reflector(writer, events).for_each(move |event| {
        match event {
            Ok(watcher::Event::Apply(object) | watcher::Event::Delete(object)) => send(&object),
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitApply(object)) => listed.push(object),
            Ok(watcher::Event::InitDone) => {
                readiness.filled(name);
                listed.drain(..).for_each(|object| send(&object));
            }
            Err(error) => {
                tracing::debug!(kind = name, %error, "watch failed; retrying with backoff")
            }
        }
        futures::future::ready(())
    });
    (reader, receivers, task)
}

/// The senders of one cache's trigger streams. A subscriber whose receiver is gone (its
/// controller stopped) is dropped at the next send, so the cache neither clones every object
/// for nobody nor keeps a dead channel for the life of the process.
struct Fanout<K> {
    senders: Vec<mpsc::UnboundedSender<Result<K, watcher::Error>>>,
}

impl<K: Clone> Fanout<K> {
    fn new(senders: Vec<mpsc::UnboundedSender<Result<K, watcher::Error>>>) -> Self {
        Self { senders }
    }

    fn send(&mut self, object: &K) {
        self.senders
            .retain(|sender| sender.unbounded_send(Ok(object.clone())).is_ok());
    }

    /// Subscribers still listening, as of the last send.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.senders.len()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::ResourceExt;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector::ObjectRef;

    use super::*;

    fn config_map(name: &str, version: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    fn cached_version(store: &Store<ConfigMap>, name: &str) -> Option<String> {
        store
            .get(&ObjectRef::new(name).within("ns"))
            .and_then(|o| o.resource_version())
    }

    /// Each event is sent only once the previous trigger was looked at, so what the store
    /// holds when a trigger arrives is exactly what the cache had applied by then.
    #[tokio::test]
    async fn every_subscriber_sees_each_change_only_after_the_cache_holds_it() {
        let (events_tx, events_rx) = mpsc::unbounded();
        let readiness = Readiness::default();
        let (store, [mut first, mut second], task) =
            shared_cache::<ConfigMap, _, 2>(events_rx, (), &readiness, "ConfigMap");
        let task = tokio::spawn(task);
        let steps = [
            (watcher::Event::Init, None),
            // Listed objects reach the store, and the subscribers, at InitDone.
            (watcher::Event::InitApply(config_map("a", "1")), None),
            (watcher::Event::InitDone, Some(("a", Some("1")))),
            (
                watcher::Event::Apply(config_map("a", "2")),
                Some(("a", Some("2"))),
            ),
            (
                watcher::Event::Apply(config_map("b", "3")),
                Some(("b", Some("3"))),
            ),
            (
                watcher::Event::Delete(config_map("a", "4")),
                Some(("a", None)),
            ),
            // A relist after the watch fell behind: the old store serves until InitDone.
            (watcher::Event::Init, None),
            (watcher::Event::InitApply(config_map("b", "5")), None),
            (watcher::Event::InitDone, Some(("b", Some("5")))),
        ];
        for (event, expected) in steps {
            events_tx.unbounded_send(Ok(event)).unwrap();
            let Some((name, version)) = expected else {
                continue;
            };
            for subscriber in [&mut first, &mut second] {
                let object = subscriber.next().await.unwrap().unwrap();
                assert_eq!(object.name_any(), name);
                assert_eq!(
                    cached_version(&store, name).as_deref(),
                    version,
                    "the trigger for {name} came before its cache update"
                );
            }
        }
        readiness.wait().await.unwrap();
        drop(events_tx);
        task.await.unwrap();
        assert!(first.next().await.is_none(), "nothing sent twice");
        assert!(second.next().await.is_none());
    }

    #[tokio::test]
    async fn neither_the_cache_nor_a_subscriber_holds_managed_fields() {
        let (events_tx, events_rx) = mpsc::unbounded();
        let readiness = Readiness::default();
        let (store, [mut subscriber], task) =
            shared_cache::<ConfigMap, _, 1>(events_rx, (), &readiness, "ConfigMap");
        let task = tokio::spawn(task);
        let mut managed = config_map("a", "1");
        managed.metadata.managed_fields = Some(vec![Default::default()]);
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(managed.clone()),
            watcher::Event::InitDone,
            watcher::Event::Apply(config_map("a", "2")),
        ] {
            events_tx.unbounded_send(Ok(event)).unwrap();
        }
        let listed = subscriber.next().await.unwrap().unwrap();
        assert_eq!(listed.metadata.managed_fields, None);
        managed.metadata.resource_version = Some("3".into());
        events_tx
            .unbounded_send(Ok(watcher::Event::Apply(managed)))
            .unwrap();
        drop(events_tx);
        task.await.unwrap();
        let cached = store.get(&ObjectRef::new("a").within("ns")).unwrap();
        assert_eq!(cached.resource_version().as_deref(), Some("3"));
        assert_eq!(cached.metadata.managed_fields, None);
    }

    #[test]
    fn a_subscriber_whose_receiver_is_gone_is_pruned() {
        let (kept_tx, mut kept) = mpsc::unbounded();
        let (gone_tx, gone) = mpsc::unbounded::<Result<ConfigMap, watcher::Error>>();
        let mut fanout = Fanout::new(vec![gone_tx, kept_tx]);
        fanout.send(&config_map("a", "1"));
        assert_eq!(fanout.len(), 2);
        drop(gone);
        fanout.send(&config_map("a", "2"));
        assert_eq!(fanout.len(), 1, "the dead subscriber is still fed");
        for version in ["1", "2"] {
            let object = kept.try_recv().unwrap().unwrap();
            assert_eq!(object.resource_version().as_deref(), Some(version));
        }
        drop(kept);
        fanout.send(&config_map("a", "3"));
        assert_eq!(fanout.len(), 0);
    }

    /// A stopped controller's trigger stream does not stop the cache the others read.
    #[tokio::test]
    async fn the_cache_goes_on_when_a_subscriber_is_gone() {
        let (events_tx, events_rx) = mpsc::unbounded();
        let readiness = Readiness::default();
        let (store, [gone, mut kept], task) =
            shared_cache::<ConfigMap, _, 2>(events_rx, (), &readiness, "ConfigMap");
        let task = tokio::spawn(task);
        drop(gone);
        for event in [
            watcher::Event::Init,
            watcher::Event::InitDone,
            watcher::Event::Apply(config_map("a", "1")),
        ] {
            events_tx.unbounded_send(Ok(event)).unwrap();
        }
        let object = kept.next().await.unwrap().unwrap();
        assert_eq!(object.name_any(), "a");
        assert_eq!(cached_version(&store, "a").as_deref(), Some("1"));
        drop(events_tx);
        task.await.unwrap();
    }

    #[tokio::test]
    async fn readiness_waits_for_the_initial_list_of_every_cache_made() {
        let (events_tx, events_rx) = mpsc::unbounded();
        let (other_tx, other_rx) = mpsc::unbounded();
        let readiness = Readiness::default();
        let (_store, [], task) =
            shared_cache::<ConfigMap, _, 0>(events_rx, (), &readiness, "ConfigMap");
        let task = tokio::spawn(task);
        // A second cache, made later, is waited for as well: nobody counts caches.
        let (_other, [], other) =
            shared_cache::<ConfigMap, _, 0>(other_rx, (), &readiness, "OtherConfigMap");
        let other = tokio::spawn(other);
        events_tx.unbounded_send(Ok(watcher::Event::Init)).unwrap();
        events_tx
            .unbounded_send(Ok(watcher::Event::InitApply(config_map("a", "1"))))
            .unwrap();
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), readiness.wait());
        assert!(waiting.await.is_err(), "ready before InitDone");
        events_tx
            .unbounded_send(Ok(watcher::Event::InitDone))
            .unwrap();
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), readiness.wait());
        assert!(
            waiting.await.is_err(),
            "ready before the other cache's list"
        );
        for event in [watcher::Event::Init, watcher::Event::InitDone] {
            other_tx.unbounded_send(Ok(event)).unwrap();
        }
        readiness.wait().await.unwrap();
        drop((events_tx, other_tx));
        task.await.unwrap();
        other.await.unwrap();
    }
}
