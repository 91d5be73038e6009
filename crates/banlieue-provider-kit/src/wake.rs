//! A backend's change feed into the machine reconciler: which machines to look at again.
//!
//! A domain event or a VM's property change names one backend object, named
//! `<namespace>-<machine>` ([`machine_of`]), so it wakes that machine alone: on a host where
//! hundreds of domains start and stop, waking every machine for every event put every
//! machine's look-up, state and address calls in front of the calls that create and destroy
//! domains. Every machine is looked at again only when the feed may have missed events (a new
//! subscription) or when more wake-ups wait than the queue holds.
//!
//! The queue is bounded ([`CAPACITY`]): a feed that outruns the reconciler does not grow it;
//! the wake-ups that do not fit become one pass over every machine.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::Stream;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;

/// Wake-ups queued at most; past it they collapse into one pass over every machine.
pub const CAPACITY: usize = 1024;

/// The longest Kubernetes object name: a longer backend name cannot name a machine.
const MAX_NAME: usize = 253;

/// What the reconciler is asked to look at again.
#[derive(Debug)]
pub enum Wake<K: kube::Resource<DynamicType = ()>> {
    /// Every machine it serves.
    All,
    /// The one machine a change concerns.
    Machine(ObjectRef<K>),
}

/// The sending side, held by a backend's change feed. Cheap to clone.
pub struct Waker<K: kube::Resource<DynamicType = ()>> {
    queue: mpsc::Sender<Wake<K>>,
    overflowed: Arc<AtomicBool>,
}

impl<K: kube::Resource<DynamicType = ()>> Clone for Waker<K> {
    fn clone(&self) -> Self {
        Waker {
            queue: self.queue.clone(),
            overflowed: self.overflowed.clone(),
        }
    }
}

impl<K: kube::Resource<DynamicType = ()>> std::fmt::Debug for Waker<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waker")
            .field("closed", &self.queue.is_closed())
            .finish_non_exhaustive()
    }
}

/// The receiving side, handed to [`crate::machine::run`].
pub struct Wakes<K: kube::Resource<DynamicType = ()>> {
    queue: mpsc::Receiver<Wake<K>>,
    overflowed: Arc<AtomicBool>,
}

impl<K: kube::Resource<DynamicType = ()>> std::fmt::Debug for Wakes<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wakes")
            .field("queued", &self.queue.len())
            .finish_non_exhaustive()
    }
}

/// A wake-up queue of [`CAPACITY`].
pub fn channel<K: kube::Resource<DynamicType = ()>>() -> (Waker<K>, Wakes<K>) {
    let (tx, rx) = mpsc::channel(CAPACITY);
    let overflowed = Arc::new(AtomicBool::new(false));
    (
        Waker {
            queue: tx,
            overflowed: overflowed.clone(),
        },
        Wakes {
            queue: rx,
            overflowed,
        },
    )
}

impl<K: kube::Resource<DynamicType = ()>> Waker<K> {
    /// Looks at `machine` again. Never waits: a full queue turns into a pass over every
    /// machine. False once the reconciler has stopped listening.
    pub fn machine(&self, machine: ObjectRef<K>) -> bool {
        self.send(Wake::Machine(machine))
    }

    /// Looks at every machine again (the feed may have missed changes).
    pub fn all(&self) -> bool {
        self.send(Wake::All)
    }

    /// Whether the reconciler has stopped listening.
    pub fn is_closed(&self) -> bool {
        self.queue.is_closed()
    }

    fn send(&self, wake: Wake<K>) -> bool {
        match self.queue.try_send(wake) {
            Ok(()) => true,
            // The queue is not empty, so the receiver wakes and finds the flag.
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.overflowed.store(true, Ordering::Release);
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }
}

impl<K: kube::Resource<DynamicType = ()>> Wakes<K> {
    /// The wake-ups in order, with [`Wake::All`] first wherever some did not fit. Ends when
    /// every [`Waker`] is gone.
    pub fn into_stream(self) -> impl Stream<Item = Wake<K>> + Send + 'static
    where
        K: Send + 'static,
    {
        futures::stream::unfold(self, |mut wakes| async move {
            let next = wakes.queue.recv().await?;
            let wake = if wakes.overflowed.swap(false, Ordering::AcqRel) {
                Wake::All
            } else {
                next
            };
            Some((wake, wakes))
        })
    }
}

/// The machine a backend object named `<namespace>-<machine>` belongs to; `None` for any
/// other name (another namespace's domain on a shared host, a VM banlieue did not make).
pub fn machine_of<K: kube::Resource<DynamicType = ()>>(
    namespace: &str,
    backend_name: &str,
) -> Option<ObjectRef<K>> {
    backend_name
        .strip_prefix(namespace)
        .and_then(|rest| rest.strip_prefix('-'))
        .filter(|name| !name.is_empty() && name.len() <= MAX_NAME)
        .map(|name| ObjectRef::new(name).within(namespace))
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::LibvirtMachine;
    use futures::StreamExt;

    fn named(name: &str) -> ObjectRef<LibvirtMachine> {
        ObjectRef::new(name).within("team-a")
    }

    #[test]
    fn backend_names_map_back_to_machines_of_the_namespace() {
        let m = machine_of::<LibvirtMachine>("team-a", "team-a-web-01").expect("ours");
        assert_eq!(m.name, "web-01");
        assert_eq!(m.namespace.as_deref(), Some("team-a"));
        assert!(machine_of::<LibvirtMachine>("team-a", "team-ab-web").is_none());
        assert!(machine_of::<LibvirtMachine>("team-a", "team-a-").is_none());
        assert!(machine_of::<LibvirtMachine>("team-a", "DC0_C0_RP0_VM0").is_none());
        let long = format!("team-a-{}", "x".repeat(MAX_NAME + 1));
        assert!(machine_of::<LibvirtMachine>("team-a", &long).is_none());
    }

    /// What a wake-up names: `None` for every machine.
    fn seen(wakes: Vec<Wake<LibvirtMachine>>) -> Vec<Option<String>> {
        wakes
            .into_iter()
            .map(|w| match w {
                Wake::All => None,
                Wake::Machine(m) => Some(m.name),
            })
            .collect()
    }

    #[tokio::test]
    async fn wake_ups_arrive_in_order_and_end_with_the_last_waker() {
        let (waker, wakes) = channel::<LibvirtMachine>();
        let second = waker.clone();
        assert!(waker.machine(named("a")));
        assert!(second.all());
        assert!(waker.machine(named("b")));
        drop((waker, second));
        let got = seen(wakes.into_stream().collect().await);
        assert_eq!(got, [Some("a".to_owned()), None, Some("b".to_owned())]);
    }

    #[tokio::test]
    async fn wake_ups_past_the_capacity_become_one_pass_over_every_machine() {
        let (waker, wakes) = channel::<LibvirtMachine>();
        for i in 0..CAPACITY + 5 {
            assert!(waker.machine(named(&format!("m{i}"))));
        }
        drop(waker);
        let got = seen(wakes.into_stream().collect().await);
        assert_eq!(
            got.len(),
            CAPACITY,
            "the queue never grows past its capacity"
        );
        assert_eq!(got[0], None, "what did not fit is covered first");
        assert_eq!(got[1].as_deref(), Some("m1"));
        assert_eq!(
            got.iter().filter(|w| w.is_none()).count(),
            1,
            "one pass covers them all"
        );
    }

    #[tokio::test]
    async fn a_waker_says_when_nobody_listens() {
        let (waker, wakes) = channel::<LibvirtMachine>();
        drop(wakes);
        assert!(waker.is_closed());
        assert!(!waker.machine(named("a")));
        assert!(!waker.all());
    }
}
