//! The store side of a pool's turn — [`observe`] and [`execute`] — against
//! a fake of the store port that writes down every call and answers as
//! each test scripts it: what is read, the order of the writes, and which
//! store answers end the turn and which do not.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use async_trait::async_trait;
use serde_json::json;

use jiff::Timestamp;

use super::{Observed, RetireReason, Step, execute, new_member, observe, template_hash};
use crate::credentials::ProxyCredentials;
use crate::resource::{
    ObjectKey, Proxy, ProxyPool, ProxyPoolStatus, ProxyStatus, QUARANTINED_ADDRESSES_ANNOTATION,
    RETIRING_ANNOTATION, SecretKeyRef,
};
use crate::resource_store::{CloudInitError, PoolStore, ProxyStore, StoreError};

/// How the fake answers one call.
#[derive(Clone, Copy)]
enum Answer {
    Gone,
    AlreadyExists,
    Refused,
}

/// A store that writes every call down, as `"<call> <key>"`, and answers
/// `Ok` unless scripted otherwise.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<String>>,
    script: HashMap<String, Answer>,
    pool: Option<ProxyPool>,
    members: Vec<Proxy>,
    status: Mutex<Option<ProxyPoolStatus>>,
}

impl Recorder {
    fn answering(script: &[(&str, Answer)]) -> Recorder {
        Recorder {
            script: script.iter().map(|(c, a)| ((*c).to_owned(), *a)).collect(),
            ..Recorder::default()
        }
    }

    fn call(&self, call: String, key: &ObjectKey) -> Result<(), StoreError> {
        let answer = self.script.get(&call).copied();
        self.calls.lock().unwrap().push(call);
        match answer {
            None => Ok(()),
            Some(Answer::Gone) => Err(StoreError::Gone {
                key: key.clone(),
                uid: "u".into(),
            }),
            Some(Answer::AlreadyExists) => Err(StoreError::AlreadyExists(key.clone())),
            Some(Answer::Refused) => Err(StoreError::Backend("quota exceeded".into())),
        }
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait]
impl PoolStore for Recorder {
    async fn get_pool(&self, key: &ObjectKey) -> Result<Option<ProxyPool>, StoreError> {
        self.calls.lock().unwrap().push(format!("get pool {key}"));
        Ok(self.pool.clone())
    }

    async fn pool_keys(&self) -> Result<Vec<ObjectKey>, StoreError> {
        Err(StoreError::Backend("not a turn's call".into()))
    }

    async fn members(&self, pool: &ProxyPool) -> Result<Vec<Proxy>, StoreError> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("members {}", crate::resource_store::pool_key(pool)));
        Ok(self.members.clone())
    }

    async fn create_member(&self, member: &Proxy) -> Result<(), StoreError> {
        let key = ObjectKey::of(member);
        self.call(format!("create {key}"), &key)
    }

    async fn delete_member(&self, key: &ObjectKey, _uid: &str) -> Result<(), StoreError> {
        self.call(format!("delete {key}"), key)
    }

    async fn write_pool_status(
        &self,
        key: &ObjectKey,
        _uid: &str,
        status: &ProxyPoolStatus,
    ) -> Result<(), StoreError> {
        self.call(format!("status {key}"), key)?;
        *self.status.lock().unwrap() = Some(status.clone());
        Ok(())
    }

    async fn publish_pool_event(
        &self,
        key: &ObjectKey,
        _uid: &str,
        member: (&ObjectKey, &str),
        reason: &str,
        _note: &str,
    ) {
        self.calls
            .lock()
            .unwrap()
            .push(format!("event {reason} {key} {}", member.0));
    }
}

#[async_trait]
impl ProxyStore for Recorder {
    async fn get(&self, _: &ObjectKey) -> Result<Option<Proxy>, StoreError> {
        Err(StoreError::Backend("not a turn's call".into()))
    }

    async fn add_finalizer(&self, _: &ObjectKey, _: &str) -> Result<(), StoreError> {
        Err(StoreError::Backend("not a turn's call".into()))
    }

    async fn remove_finalizer(&self, _: &ObjectKey, _: &str) -> Result<(), StoreError> {
        Err(StoreError::Backend("not a turn's call".into()))
    }

    async fn set_annotation(
        &self,
        key: &ObjectKey,
        _uid: &str,
        name: &str,
        _value: Option<&str>,
    ) -> Result<(), StoreError> {
        let which = match name {
            RETIRING_ANNOTATION => "retiring",
            QUARANTINED_ADDRESSES_ANNOTATION => "quarantine",
            other => other,
        };
        self.call(format!("annotate {which} {key}"), key)
    }

    async fn write_status(&self, _: &ObjectKey, _: &str, _: &ProxyStatus) -> Result<(), StoreError> {
        Err(StoreError::Backend("not a turn's call".into()))
    }

    async fn proxy_credentials(
        &self,
        _: &ObjectKey,
        _: &str,
        _: &str,
    ) -> Result<ProxyCredentials, StoreError> {
        Err(StoreError::Backend("not a turn's call".into()))
    }

    async fn secret_key(&self, namespace: &str, name: &str, _: &str) -> Result<Vec<u8>, CloudInitError> {
        Err(CloudInitError::SecretNotFound {
            namespace: namespace.into(),
            name: name.into(),
        })
    }

    async fn cloud_init(&self, namespace: &str, secret: &SecretKeyRef) -> Result<Vec<u8>, CloudInitError> {
        Err(CloudInitError::SecretNotFound {
            namespace: namespace.into(),
            name: secret.name.clone(),
        })
    }

    async fn live_uids(&self) -> Result<HashSet<String>, StoreError> {
        Err(StoreError::Backend("not a turn's call".into()))
    }

    async fn keys(&self) -> Result<Vec<ObjectKey>, StoreError> {
        Err(StoreError::Backend("not a turn's call".into()))
    }
}

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

fn pool() -> ProxyPool {
    serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "eu", "namespace": "ns", "uid": "pool-uid", "generation": 1},
        "spec": {"replicas": 2, "template": {"spec": {"mode": "Managed", "provider": "local"}}}
    }))
    .unwrap()
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new("ns", name)
}

fn member(suffix: &str) -> Proxy {
    let pool = pool();
    new_member(&pool, suffix, &template_hash(&pool.spec.template))
}

/// A turn with one of each write: delete `eu-old`, retire `eu-due`,
/// annotate `eu-kept`, create `eu-new1` and `eu-new2`.
fn every_write() -> Step {
    Step {
        delete: vec![(key("eu-old"), "uid-old".into())],
        retire: vec![(
            key("eu-due"),
            "uid-due".into(),
            format!("{} blocked", now()),
            RetireReason::Blocked,
        )],
        annotate: vec![(key("eu-kept"), "uid-kept".into(), "127.0.0.2=x".into())],
        create: vec![member("new1"), member("new2")],
        status: ProxyPoolStatus {
            replicas: 3,
            ..Default::default()
        },
    }
}

async fn run(store: &Recorder, decided: Result<Step, Vec<String>>) -> Result<ProxyPoolStatus, StoreError> {
    execute(&key("eu"), &pool(), decided, store, store, now()).await
}

fn replica_failure(status: &ProxyPoolStatus) -> Option<(String, String, String)> {
    let c = status.conditions.iter().find(|c| c.type_ == "ReplicaFailure")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test]
async fn a_turn_deletes_then_retires_then_annotates_then_creates_then_writes_the_status() {
    let store = Recorder::default();
    let status = run(&store, Ok(every_write())).await.unwrap();
    assert_eq!(
        store.calls(),
        [
            "delete ns/eu-old",
            "annotate retiring ns/eu-due",
            "event MemberRetiring ns/eu ns/eu-due",
            "annotate quarantine ns/eu-kept",
            "create ns/eu-new1",
            "create ns/eu-new2",
            "status ns/eu",
        ]
    );
    assert_eq!(status.replicas, 3);
    assert_eq!(replica_failure(&status), None);
    assert_eq!(store.status.lock().unwrap().as_ref(), Some(&status));
}

#[tokio::test]
async fn members_gone_before_their_delete_or_annotation_do_not_end_the_turn() {
    let store = Recorder::answering(&[
        ("delete ns/eu-old", Answer::Gone),
        ("annotate quarantine ns/eu-kept", Answer::Gone),
    ]);
    run(&store, Ok(every_write())).await.unwrap();
    let calls = store.calls();
    assert_eq!(calls.len(), 7, "every write still made: {calls:?}");
    assert_eq!(calls.last().map(String::as_str), Some("status ns/eu"));
}

#[tokio::test]
async fn a_taken_name_is_skipped_and_the_other_creates_go_on() {
    let store = Recorder::answering(&[("create ns/eu-new1", Answer::AlreadyExists)]);
    let status = run(&store, Ok(every_write())).await.unwrap();
    let calls = store.calls();
    assert_eq!(
        calls[4..],
        ["create ns/eu-new1", "create ns/eu-new2", "status ns/eu"]
    );
    assert_eq!(replica_failure(&status), None, "a taken name is no failure");
}

#[tokio::test]
async fn a_refused_create_stops_the_creates_and_is_told_in_the_status() {
    let store = Recorder::answering(&[("create ns/eu-new1", Answer::Refused)]);
    let status = run(&store, Ok(every_write())).await.unwrap();
    assert_eq!(
        store.calls()[4..],
        ["create ns/eu-new1", "status ns/eu"],
        "no second create after a refusal; the status is still written"
    );
    let (state, reason, message) = replica_failure(&status).unwrap();
    assert_eq!((state.as_str(), reason.as_str()), ("True", "FailedCreate"));
    assert!(message.contains("quota exceeded"), "{message}");

    // The next turn's creates succeed: the condition turns False again.
    let mut again = every_write();
    again.status = status;
    let store = Recorder::default();
    let status = run(&store, Ok(again)).await.unwrap();
    let (state, reason, _) = replica_failure(&status).unwrap();
    assert_eq!((state.as_str(), reason.as_str()), ("False", "Created"));
}

#[tokio::test]
async fn any_other_store_error_ends_the_turn_where_it_happened() {
    // A refused delete: nothing after it, not even the status.
    let store = Recorder::answering(&[("delete ns/eu-old", Answer::Refused)]);
    let error = run(&store, Ok(every_write())).await.unwrap_err();
    assert!(matches!(error, StoreError::Backend(_)), "{error}");
    assert_eq!(store.calls(), ["delete ns/eu-old"]);

    // A member gone before its retiring annotation ends the turn too (the
    // next turn sees it gone): no create runs ahead of a failed retirement.
    let store = Recorder::answering(&[("annotate retiring ns/eu-due", Answer::Gone)]);
    let error = run(&store, Ok(every_write())).await.unwrap_err();
    assert!(matches!(error, StoreError::Gone { .. }), "{error}");
    assert_eq!(store.calls(), ["delete ns/eu-old", "annotate retiring ns/eu-due"]);

    // A refused quarantine annotation: no creates, no status.
    let store = Recorder::answering(&[("annotate quarantine ns/eu-kept", Answer::Refused)]);
    run(&store, Ok(every_write())).await.unwrap_err();
    assert_eq!(
        store.calls().last().map(String::as_str),
        Some("annotate quarantine ns/eu-kept")
    );

    // A refused status write is the turn's error.
    let store = Recorder::answering(&[("status ns/eu", Answer::Refused)]);
    run(&store, Ok(Step::default())).await.unwrap_err();
}

#[tokio::test]
async fn the_status_is_written_only_when_it_changed_and_a_pool_gone_is_no_error() {
    let mut unchanged = pool();
    unchanged.status = Some(ProxyPoolStatus {
        replicas: 2,
        ..Default::default()
    });
    let step = Step {
        status: unchanged.status.clone().unwrap(),
        ..Step::default()
    };
    let store = Recorder::default();
    execute(&key("eu"), &unchanged, Ok(step), &store, &store, now())
        .await
        .unwrap();
    assert!(store.calls().is_empty(), "{:?}", store.calls());

    let store = Recorder::answering(&[("status ns/eu", Answer::Gone)]);
    let status = run(&store, Ok(Step::default())).await.unwrap();
    assert_eq!(status, ProxyPoolStatus::default());
    assert_eq!(store.calls(), ["status ns/eu"]);
}

#[tokio::test]
async fn an_invalid_spec_writes_only_its_status() {
    let store = Recorder::default();
    let problems = vec!["maxSurge and maxUnavailable cannot both be 0".to_owned()];
    let status = run(&store, Err(problems)).await.unwrap();
    assert_eq!(store.calls(), ["status ns/eu"]);
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "InvalidSpec")
    );
    assert!(ready.message.contains("cannot both be 0"));
}

#[tokio::test]
async fn observe_reads_the_pool_and_its_members_and_nothing_of_a_pool_gone_or_going() {
    let store = Recorder::default();
    assert!(observe(&store, &key("eu")).await.unwrap().is_none());
    assert_eq!(store.calls(), ["get pool ns/eu"]);

    let mut going = pool();
    going.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    let store = Recorder {
        pool: Some(going),
        members: vec![member("aaaaa")],
        ..Recorder::default()
    };
    assert!(observe(&store, &key("eu")).await.unwrap().is_none());
    assert_eq!(
        store.calls(),
        ["get pool ns/eu"],
        "its members go with it: not read"
    );

    let store = Recorder {
        pool: Some(pool()),
        members: vec![member("aaaaa"), member("bbbbb")],
        ..Recorder::default()
    };
    let Observed { pool, members } = observe(&store, &key("eu")).await.unwrap().unwrap();
    assert_eq!(pool.metadata.uid.as_deref(), Some("pool-uid"));
    let names: Vec<_> = members.iter().map(|m| ObjectKey::of(m).to_string()).collect();
    assert_eq!(names, ["ns/eu-aaaaa", "ns/eu-bbbbb"]);
    assert_eq!(store.calls(), ["get pool ns/eu", "members ns/eu"]);
}
