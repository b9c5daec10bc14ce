//! A provider whose instances have states over time and that can be told to
//! fail any operation with any error class. It records every call, and the
//! largest number of instances that ever existed at once for one Proxy UID,
//! so tests can prove "never two instances".

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;

use async_trait::async_trait;
use egress_proxies::domain::provider_contract::{
    CreateRequest, ErrorClass, Instance, InstanceState, Op, Provider, ProviderError, ProviderId,
};

/// One recorded call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Create(String),
    Get(String),
    Delete(String),
    List,
    Release(String),
}

#[derive(Clone, Debug)]
struct Sim {
    uid: String,
    namespace: String,
    installation: String,
    released: bool,
    /// Still listed by `list_by_tag` though released.
    listed_while_released: bool,
    created_at: jiff::Timestamp,
    gets: u32,
    stopped: bool,
    /// Gets left before a deleted instance is really gone.
    deleting: Option<u32>,
    spec_port: u16,
}

#[derive(Default)]
struct World {
    instances: BTreeMap<String, Sim>,
    failures: HashMap<&'static str, VecDeque<ErrorClass>>,
    calls: Vec<Call>,
    max_per_uid: HashMap<String, usize>,
    panic_after_next_create: bool,
    /// How long a listing takes (a slow cloud API).
    list_delay: std::time::Duration,
}

pub struct ScriptedProvider {
    name: String,
    /// Gets an instance stays Provisioning before it runs.
    boot_gets: u32,
    /// Gets a deleted instance lingers before it is NotFound.
    delete_gets: u32,
    world: Mutex<World>,
}

fn op_name(op: Op) -> &'static str {
    op.as_str()
}

impl ScriptedProvider {
    pub fn new(name: &str, boot_gets: u32, delete_gets: u32) -> Self {
        Self {
            name: name.to_owned(),
            boot_gets,
            delete_gets,
            world: Mutex::new(World::default()),
        }
    }

    fn world(&self) -> std::sync::MutexGuard<'_, World> {
        self.world.lock().unwrap()
    }

    /// The next `count` calls of `op` fail with `class`.
    pub fn fail(&self, op: Op, class: ErrorClass, count: usize) {
        let mut w = self.world();
        let q = w.failures.entry(op_name(op)).or_default();
        q.extend(std::iter::repeat_n(class, count));
    }

    /// Drops the failures still scripted for `op`.
    pub fn heal(&self, op: Op) {
        self.world().failures.remove(op_name(op));
    }

    /// Every listing takes `delay` from now on.
    pub fn slow_list(&self, delay: std::time::Duration) {
        self.world().list_delay = delay;
    }

    /// The next create makes the instance, then panics (a crash mid-create).
    pub fn panic_after_next_create(&self) {
        self.world().panic_after_next_create = true;
    }

    pub fn calls(&self) -> Vec<Call> {
        self.world().calls.clone()
    }

    pub fn count(&self, pred: impl Fn(&Call) -> bool) -> usize {
        self.world().calls.iter().filter(|c| pred(c)).count()
    }

    /// Names of instances that exist (including ones being deleted).
    pub fn instances(&self) -> Vec<String> {
        self.world().instances.keys().cloned().collect()
    }

    pub fn live_instances(&self) -> Vec<String> {
        self.world()
            .instances
            .iter()
            .filter(|(_, s)| s.deleting.is_none())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Most instances that ever existed at the same time for one UID.
    pub fn max_per_uid(&self) -> usize {
        self.world().max_per_uid.values().copied().max().unwrap_or(0)
    }

    /// An instance of this installation made outside the operator's current
    /// knowledge (a leak), `age` old, for a Proxy in namespace `crawl`.
    pub fn plant(&self, name: &str, uid: &str, age: std::time::Duration) {
        self.plant_owned(name, uid, "crawl", Some(super::INSTALLATION), age);
    }

    /// An instance with the given tags (`installation: None`: untagged).
    pub fn plant_owned(
        &self,
        name: &str,
        uid: &str,
        namespace: &str,
        installation: Option<&str>,
        age: std::time::Duration,
    ) {
        let created_at = jiff::Timestamp::now() - jiff::SignedDuration::try_from(age).unwrap();
        self.world().instances.insert(
            name.to_owned(),
            Sim {
                uid: uid.to_owned(),
                namespace: namespace.to_owned(),
                installation: installation.unwrap_or_default().to_owned(),
                released: false,
                listed_while_released: false,
                created_at,
                gets: 0,
                stopped: false,
                deleting: None,
                spec_port: 3128,
            },
        );
    }

    /// Marks an instance released while it still lists as managed (as a
    /// provider whose listing lags behind a release).
    pub fn set_released_but_listed(&self, name: &str) {
        if let Some(s) = self.world().instances.get_mut(name) {
            s.released = true;
            s.listed_while_released = true;
        }
    }

    /// The instance stops by itself (as a VM that crashed).
    pub fn stop(&self, name: &str) {
        if let Some(s) = self.world().instances.get_mut(name) {
            s.stopped = true;
        }
    }

    /// The instance vanishes behind the operator's back.
    pub fn vanish(&self, name: &str) {
        self.world().instances.remove(name);
    }

    fn take_failure(&self, w: &mut World, op: Op, id: Option<&str>) -> Result<(), ProviderError> {
        match w.failures.get_mut(op_name(op)).and_then(VecDeque::pop_front) {
            Some(class) => Err(ProviderError::new(
                class,
                op,
                &self.name,
                id,
                format!("scripted {class} failure"),
            )),
            None => Ok(()),
        }
    }
}

fn name_of(id: &ProviderId) -> String {
    id.as_str().trim_start_matches("sim/").to_owned()
}

#[async_trait]
impl Provider for ScriptedProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "scripted"
    }

    async fn create(&self, req: &CreateRequest) -> Result<ProviderId, ProviderError> {
        let name = req.name.to_string();
        let panic_now = {
            let mut w = self.world();
            w.calls.push(Call::Create(name.clone()));
            self.take_failure(&mut w, Op::Create, Some(&name))?;
            if !w.instances.contains_key(&name) {
                w.instances.insert(
                    name.clone(),
                    Sim {
                        uid: req.uid.clone(),
                        namespace: req.namespace.clone(),
                        installation: req.installation.to_string(),
                        released: false,
                        listed_while_released: false,
                        created_at: jiff::Timestamp::now(),
                        gets: 0,
                        stopped: false,
                        deleting: None,
                        spec_port: req.port,
                    },
                );
            }
            let alive = w.instances.values().filter(|s| s.uid == req.uid).count();
            let max = w.max_per_uid.entry(req.uid.clone()).or_default();
            *max = (*max).max(alive);
            std::mem::take(&mut w.panic_after_next_create)
        };
        if panic_now {
            panic!("scripted crash right after creating {name}");
        }
        Ok(ProviderId(format!("sim/{name}")))
    }

    async fn get(&self, id: &ProviderId) -> Result<Instance, ProviderError> {
        let name = name_of(id);
        let mut w = self.world();
        w.calls.push(Call::Get(name.clone()));
        self.take_failure(&mut w, Op::Get, Some(id.as_str()))?;
        let not_found = || {
            ProviderError::new(
                ErrorClass::NotFound,
                Op::Get,
                &self.name,
                Some(id.as_str()),
                "gone",
            )
        };
        let Some(sim) = w.instances.get_mut(&name) else {
            return Err(not_found());
        };
        if let Some(left) = sim.deleting {
            if left == 0 {
                w.instances.remove(&name);
                return Err(not_found());
            }
            sim.deleting = Some(left - 1);
            return Ok(self.instance(id, sim, InstanceState::Running));
        }
        sim.gets += 1;
        let state = if sim.stopped {
            InstanceState::Stopped
        } else if sim.gets <= self.boot_gets {
            InstanceState::Provisioning
        } else {
            InstanceState::Running
        };
        let sim = sim.clone();
        Ok(self.instance(id, &sim, state))
    }

    async fn delete(&self, id: &ProviderId) -> Result<(), ProviderError> {
        let name = name_of(id);
        let mut w = self.world();
        w.calls.push(Call::Delete(name.clone()));
        self.take_failure(&mut w, Op::Delete, Some(id.as_str()))?;
        let linger = self.delete_gets;
        if let Some(sim) = w.instances.get_mut(&name) {
            if linger == 0 {
                w.instances.remove(&name);
            } else if sim.deleting.is_none() {
                sim.deleting = Some(linger);
            }
        }
        Ok(())
    }

    async fn release(&self, id: &ProviderId) -> Result<(), ProviderError> {
        let name = name_of(id);
        let mut w = self.world();
        w.calls.push(Call::Release(name.clone()));
        self.take_failure(&mut w, Op::Release, Some(id.as_str()))?;
        if let Some(sim) = w.instances.get_mut(&name) {
            sim.released = true;
        }
        Ok(())
    }

    async fn list_by_tag(&self) -> Result<Vec<Instance>, ProviderError> {
        // Recorded as it is made: a test can see a slow list under way.
        let delay = {
            let mut w = self.world();
            w.calls.push(Call::List);
            w.list_delay
        };
        tokio::time::sleep(delay).await;
        let mut w = self.world();
        self.take_failure(&mut w, Op::List, None)?;
        Ok(w.instances
            .iter()
            .filter(|(_, s)| !s.released || s.listed_while_released)
            .map(|(n, s)| self.instance(&ProviderId(format!("sim/{n}")), s, InstanceState::Running))
            .collect())
    }
}

impl ScriptedProvider {
    fn instance(&self, id: &ProviderId, sim: &Sim, state: InstanceState) -> Instance {
        Instance {
            id: id.clone(),
            state,
            ip: (state == InstanceState::Running).then_some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))),
            port: Some(sim.spec_port),
            outgoing_address: None,
            owner: egress_proxies::domain::provider_contract::Ownership {
                uid: Some(sim.uid.clone()),
                namespace: Some(sim.namespace.clone()),
                installation: Some(sim.installation.clone()).filter(|i| !i.is_empty()),
                released: sim.released,
            },
            created_at: Some(sim.created_at),
            reason: (state == InstanceState::Stopped).then(|| "scripted to stop".to_owned()),
        }
    }
}
