use std::time::{Duration, Instant};

use std::io::Write;

use super::*;
use crate::domain::lease::ProxyTally;
use crate::domain::resource::ObjectKey;
use std::fs::OpenOptions;

fn key(name: &str) -> ObjectKey {
    ObjectKey::new("crawl", name)
}

fn now() -> Timestamp {
    Timestamp::now()
}

fn later(s: i64) -> Timestamp {
    now().checked_add(jiff::SignedDuration::from_secs(s)).unwrap()
}

fn granted(id: &str, proxy: &str, expires: Timestamp) -> LeaseChange {
    LeaseChange::Granted(LeaseRecord {
        id: id.into(),
        proxy: key(proxy),
        target: "example.org".into(),
        expires,
        ttl_ms: 600_000,
        client: Some("crawler-7".into()),
        owner: Some("team-a".into()),
    })
}

fn ended(id: &str, proxy: &str, until: Timestamp) -> LeaseChange {
    LeaseChange::Ended(EndedRecord {
        id: id.into(),
        proxy: key(proxy),
        target: "example.org".into(),
        until,
        owner: Some("team-a".into()),
    })
}

fn write(log: &mut FileLeaseJournal, changes: &[LeaseChange]) {
    assert!(matches!(log.record(changes).unwrap(), Durable::Now));
}

fn current_log(dir: &Path) -> PathBuf {
    logs(&dir.join(LEASES_DIR)).unwrap().pop().unwrap().1
}

fn wait_for_fold(log: &FileLeaseJournal) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while log.folding.running.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "fold did not finish");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Opens the log and waits for the fold of what an earlier run left (so
/// no fold outlives the test's directory).
fn open(dir: &Path) -> FileLeaseJournal {
    let log = FileLeaseJournal::open(dir).unwrap();
    wait_for_fold(&log);
    log
}

#[test]
fn changes_survive_a_reopen_and_ended_state_is_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    assert_eq!(log.load(now()).unwrap(), LeaseSnapshot::default());
    // Instants compared after the reopen are taken once: a second may pass meanwhile.
    let (rest_until, extended_to) = (later(30), later(700));
    write(
        &mut log,
        &[
            granted("held", "a", later(600)),
            granted("done", "b", later(60)),
            ended("done", "b", later(600)),
            LeaseChange::TargetRest {
                target: "example.org".into(),
                proxy: key("b"),
                until: rest_until,
            },
            // A shorter rest never shortens a longer one.
            LeaseChange::TargetRest {
                target: "example.org".into(),
                proxy: key("b"),
                until: later(10),
            },
            LeaseChange::ProxyRest {
                proxy: key("c"),
                until: later(5),
            },
            LeaseChange::BlockedBy {
                proxy: key("c"),
                target: 7,
            },
            LeaseChange::BlockedBy {
                proxy: key("c"),
                target: 7,
            },
            LeaseChange::BlockedBy {
                proxy: key("b"),
                target: 9,
            },
            LeaseChange::Errors {
                proxy: key("c"),
                count: 2,
            },
        ],
    );
    write(
        &mut log,
        &[LeaseChange::Extended {
            id: "held".into(),
            expires: extended_to,
        }],
    );
    drop(log);

    let mut log = open(dir.path());
    let snapshot = log.load(now()).unwrap();
    assert_eq!(snapshot.leases.len(), 1);
    assert_eq!(snapshot.leases[0].id, "held");
    assert_eq!(snapshot.leases[0].expires.as_second(), extended_to.as_second());
    assert_eq!(snapshot.leases[0].client.as_deref(), Some("crawler-7"));
    assert_eq!(snapshot.ended.len(), 1);
    assert_eq!(snapshot.target_rests.len(), 1);
    assert_eq!(snapshot.target_rests[0].2.as_second(), rest_until.as_second());
    assert_eq!(snapshot.proxy_rests.len(), 1);
    assert_eq!(
        snapshot.tallies,
        [
            ProxyTally {
                proxy: key("b"),
                blocked_targets: vec![9],
                errors: 0
            },
            ProxyTally {
                proxy: key("c"),
                blocked_targets: vec![7],
                errors: 2
            },
        ]
    );
    write(&mut log, &[LeaseChange::ProxyRemoved(key("b"))]);
    drop(log);

    // Ten seconds on, c's rest is over; b's state went with b.
    let mut log = open(dir.path());
    let snapshot = log.load(later(10)).unwrap();
    assert!(snapshot.proxy_rests.is_empty());
    assert!(snapshot.ended.is_empty() && snapshot.target_rests.is_empty());
    assert_eq!(snapshot.leases.len(), 1, "other proxies are untouched");
    assert_eq!(snapshot.tallies.len(), 1, "a tally outlives rests, not its proxy");
}

#[test]
fn a_line_cut_short_by_a_crash_is_ignored_and_a_corrupt_one_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    write(&mut log, &[granted("held", "a", later(600))]);
    drop(log);
    let path = current_log(dir.path());
    let mut file = OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(br#"{"op":"granted","id":"torn","pro"#).unwrap();
    drop(file);

    let mut log = open(dir.path());
    let snapshot = log.load(now()).unwrap();
    assert_eq!(
        snapshot.leases.iter().map(|l| l.id.as_str()).collect::<Vec<_>>(),
        ["held"]
    );
    wait_for_fold(&log);
    drop(log);

    // A damaged line in the middle is not guessed around: the start fails, naming it.
    let path = current_log(dir.path());
    fs::write(
        &path,
        "{\"op\":\"nonsense\"}\n{\"op\":\"proxyRemoved\",\"proxy\":\"crawl/a\"}\n",
    )
    .unwrap();
    let err = FileLeaseJournal::open(dir.path())
        .err()
        .expect("a corrupt log must not open");
    let shown = err.to_string();
    assert!(shown.contains(&format!("{}:1", path.display())), "{shown}");
}

#[test]
fn a_grown_log_is_folded_into_the_base_and_reads_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    // Held leases, plus many that ended (and their rests) long enough ago
    // that folding drops them, until the log passes MIN_FOLD_BYTES and the
    // next one starts.
    let expired = now().checked_sub(jiff::SignedDuration::from_secs(1)).unwrap();
    let (first, mut n) = (log.number, 0);
    while log.number == first {
        let id = format!("lease-{n:08}");
        write(
            &mut log,
            &[
                granted(&id, "b", later(60)),
                ended(&id, "b", expired),
                LeaseChange::TargetRest {
                    target: format!("site-{n}.example"),
                    proxy: key("b"),
                    until: expired,
                },
            ],
        );
        n += 1;
    }
    write(&mut log, &[granted("held", "a", later(600))]);
    for i in 0..20 {
        write(&mut log, &[granted(&format!("held-{i}"), "a", later(600))]);
    }
    wait_for_fold(&log);
    let dir_path = dir.path().join(LEASES_DIR);
    let base = read_base(&dir_path).unwrap();
    assert!(base.covers >= 1, "the sealed log is covered");
    assert!(
        fs::metadata(dir_path.join(BASE_FILE)).unwrap().len() < 64 * 1024,
        "what ended is dropped from the base"
    );
    assert_eq!(logs(&dir_path).unwrap().len(), 1, "covered logs are deleted");
    write(&mut log, &[ended("held-0", "a", later(600))]);
    drop(log);

    let mut log = open(dir.path());
    let snapshot = log.load(now()).unwrap();
    assert_eq!(snapshot.leases.len(), 20, "held, held-1..19");
    assert_eq!(
        snapshot.ended.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
        ["held-0"]
    );
}

#[test]
fn logs_a_base_covers_are_skipped_whichever_step_a_crash_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    write(&mut log, &[granted("l1", "a", later(600))]);
    write(&mut log, &[ended("l1", "a", later(600))]);
    let sealed = current_log(dir.path());
    let number = log.number;
    drop(log);
    // A crash after the new base was renamed into place, before the logs
    // it covers were deleted: the base says it covers them.
    let leases = dir.path().join(LEASES_DIR);
    let kept = fs::read(&sealed).unwrap();
    fold(&leases, number).unwrap();
    // And a stale line that would resurrect l1 if the log were replayed.
    fs::write(
        &sealed,
        [kept, br#"{"op":"granted","id":"l1","proxy":"crawl/a","target":"example.org","expiresMs":99999999999999,"ttlMs":1}"#.to_vec(), b"\n".to_vec()].concat(),
    )
    .unwrap();
    fs::write(leases.join(BASE_TEMP), b"half a base").unwrap();

    let mut log = open(dir.path());
    let snapshot = log.load(now()).unwrap();
    assert!(snapshot.leases.is_empty(), "{snapshot:?}");
    assert_eq!(snapshot.ended.len(), 1);
    assert!(!sealed.exists(), "a covered log is deleted");
    assert!(!leases.join(BASE_TEMP).exists());
}

#[test]
fn a_failed_write_leaves_no_part_line_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    write(&mut log, &[granted("l1", "a", later(600))]);
    // As if a write had failed half way: garbage past the last whole line.
    let path = current_log(dir.path());
    let mut file = OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(b"{\"op\":\"gran").unwrap();
    log.dirty_tail = true;
    write(&mut log, &[granted("l2", "a", later(600))]);
    drop(log);
    let mut log = open(dir.path());
    assert_eq!(log.load(now()).unwrap().leases.len(), 2);
}

#[test]
fn lines_written_before_leases_had_owners_load_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    drop(log);
    let path = current_log(dir.path());
    let (expires, until) = (later(600).as_millisecond(), later(300).as_millisecond());
    fs::write(
        &path,
        format!(
            "{{\"op\":\"granted\",\"id\":\"old\",\"proxy\":\"crawl/a\",\"target\":\"example.org\",\"expiresMs\":{expires},\"ttlMs\":600000,\"client\":\"c\"}}\n\
             {{\"op\":\"granted\",\"id\":\"gone\",\"proxy\":\"crawl/b\",\"target\":\"example.org\",\"expiresMs\":{expires},\"ttlMs\":600000}}\n\
             {{\"op\":\"ended\",\"id\":\"gone\",\"proxy\":\"crawl/b\",\"target\":\"example.org\",\"untilMs\":{until}}}\n"
        ),
    )
    .unwrap();
    let mut log = open(dir.path());
    let snapshot = log.load(now()).unwrap();
    assert_eq!(snapshot.leases.len(), 1);
    assert_eq!(
        (
            snapshot.leases[0].id.as_str(),
            snapshot.leases[0].owner.as_deref()
        ),
        ("old", None)
    );
    assert_eq!(
        (snapshot.ended[0].id.as_str(), snapshot.ended[0].owner.as_deref()),
        ("gone", None)
    );
    // Written now, the owner comes back.
    write(&mut log, &[granted("new", "c", later(600))]);
    drop(log);
    let snapshot = open(dir.path()).load(now()).unwrap();
    let new = snapshot.leases.iter().find(|l| l.id == "new").unwrap();
    assert_eq!(new.owner.as_deref(), Some("team-a"));
}
