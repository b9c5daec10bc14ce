//! The fake keeps the documented semantics it claims (see the crate docs),
//! checked over real HTTP with a plain client.

use std::time::Duration;

use base64::Engine;
use fake_compute::{FakeCompute, Fault};
use serde_json::{Value, json};

fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

fn b64(v: &Value) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
}

async fn token(fake: &FakeCompute, client: &reqwest::Client, aud: &str, scope: &str) -> reqwest::Response {
    let jwt = format!(
        "{}.{}.c2lnbmF0dXJl",
        b64(&json!({"alg": "RS256", "typ": "JWT"})),
        b64(
            &json!({"iss": "sa@p.iam.gserviceaccount.com", "aud": aud, "scope": scope, "iat": 1, "exp": 3601})
        )
    );
    client
        .post(fake.token_uri())
        .form(&[
            ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
            ("assertion", &jwt),
        ])
        .send()
        .await
        .unwrap()
}

async fn bearer(fake: &FakeCompute, client: &reqwest::Client) -> String {
    let answer: Value = token(
        fake,
        client,
        &fake.token_uri(),
        "https://www.googleapis.com/auth/compute",
    )
    .await
    .json()
    .await
    .unwrap();
    answer["access_token"].as_str().unwrap().to_owned()
}

fn vm(name: &str, zone: &str, uid: &str) -> Value {
    json!({
        "name": name,
        "machineType": format!("zones/{zone}/machineTypes/e2-micro"),
        "disks": [{"boot": true, "autoDelete": true, "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12", "diskSizeGb": "10"}}],
        "networkInterfaces": [{"network": "global/networks/default", "accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}],
        "labels": {"egress-proxies-managed": "true", "egress-proxies-uid": uid},
    })
}

#[tokio::test]
async fn tokens_are_needed_issued_for_the_jwt_grant_and_expire() {
    let fake = FakeCompute::start("p").unwrap();
    let client = client();
    let url = format!("{}projects/p/zones/z/instances/x", fake.api_root());
    assert_eq!(client.get(&url).send().await.unwrap().status(), 401, "no token");
    assert_eq!(
        client
            .get(&url)
            .bearer_auth("made-up")
            .send()
            .await
            .unwrap()
            .status(),
        401,
        "a token the fake did not issue"
    );
    assert_eq!(
        token(
            &fake,
            &client,
            "http://elsewhere/token",
            "https://www.googleapis.com/auth/compute"
        )
        .await
        .status(),
        400
    );
    assert_eq!(
        token(
            &fake,
            &client,
            &fake.token_uri(),
            "https://www.googleapis.com/auth/drive"
        )
        .await
        .status(),
        400
    );
    fake.state().token_lifetime = Duration::from_millis(300);
    let t = bearer(&fake, &client).await;
    let not_found = client.get(&url).bearer_auth(&t).send().await.unwrap();
    assert_eq!(not_found.status(), 404);
    let body: Value = not_found.json().await.unwrap();
    assert_eq!(body["error"]["errors"][0]["reason"], "notFound");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        client.get(&url).bearer_auth(&t).send().await.unwrap().status(),
        401,
        "expired"
    );
}

#[tokio::test]
async fn instances_are_validated_progress_and_are_deleted_asynchronously() {
    let fake = FakeCompute::start("p").unwrap();
    fake.state().step = Duration::from_millis(200);
    let client = client();
    let t = bearer(&fake, &client).await;
    let insert = format!("{}projects/p/zones/europe-west1-b/instances", fake.api_root());
    let post = |body: Value| client.post(&insert).bearer_auth(&t).json(&body).send();

    for (bad, field) in [
        (json!({"name": "Bad_Name"}), "name"),
        (vm("ok", "us-east1-b", "u"), "machineType"),
        (
            {
                let mut v = vm("ok", "europe-west1-b", "u");
                v["disks"] = json!([]);
                v
            },
            "disks",
        ),
        (
            {
                let mut v = vm("ok", "europe-west1-b", "u");
                v["networkInterfaces"] = json!([]);
                v
            },
            "networkInterfaces",
        ),
        (
            {
                let mut v = vm("ok", "europe-west1-b", "u");
                v["labels"] = json!({"Bad.Key": "x"});
                v
            },
            "labels.Bad.Key",
        ),
    ] {
        let r = post(bad).await.unwrap();
        assert_eq!(r.status(), 400);
        let body: Value = r.json().await.unwrap();
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("resource.{field}'")),
            "{body}"
        );
    }

    let op: Value = post(vm("proxy-a", "europe-west1-b", "u1"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (op["kind"].as_str(), op["operationType"].as_str()),
        (Some("compute#operation"), Some("insert"))
    );
    let again = post(vm("proxy-a", "europe-west1-b", "u1")).await.unwrap();
    assert_eq!(again.status(), 409);
    let body: Value = again.json().await.unwrap();
    assert_eq!(body["error"]["errors"][0]["reason"], "alreadyExists");

    let get = || async {
        let r = client
            .get(format!("{insert}/proxy-a"))
            .bearer_auth(&t)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    let (_, first) = get().await;
    assert_eq!(first["status"], "PROVISIONING");
    assert!(
        first["networkInterfaces"][0]["accessConfigs"][0]
            .get("natIP")
            .is_none()
    );
    assert!(first["creationTimestamp"].as_str().unwrap().ends_with("-08:00"));
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(get().await.1["status"], "STAGING");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_, running) = get().await;
    assert_eq!(running["status"], "RUNNING");
    assert_eq!(
        running["networkInterfaces"][0]["accessConfigs"][0]["natIP"],
        "127.0.0.1"
    );
    assert!(
        running["zone"]
            .as_str()
            .unwrap()
            .ends_with("/zones/europe-west1-b")
    );

    let del = client
        .delete(format!("{insert}/proxy-a"))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 200);
    assert_eq!(get().await.1["status"], "STOPPING");
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(get().await.0, 404);
    let del = client
        .delete(format!("{insert}/proxy-a"))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 404);

    // Injected faults come once each, in the Google error envelope.
    fake.state().inject(
        Fault {
            method: "POST".into(),
            path_contains: "/instances".into(),
            status: 403,
            reason: "quotaExceeded".into(),
        },
        1,
    );
    let r = post(vm("proxy-b", "europe-west1-b", "u2")).await.unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["errors"][0]["reason"],
        "quotaExceeded"
    );
    assert_eq!(
        post(vm("proxy-b", "europe-west1-b", "u2"))
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn aggregated_list_filters_pages_and_reports_unreachable_zones() {
    let fake = FakeCompute::start("p").unwrap();
    let client = client();
    let t = bearer(&fake, &client).await;
    for (i, zone) in ["a-1", "b-1", "b-1", "c-1"].iter().enumerate() {
        let r = client
            .post(format!("{}projects/p/zones/{zone}/instances", fake.api_root()))
            .bearer_auth(&t)
            .json(&vm(&format!("vm-{i}"), zone, &format!("u{i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let mut other = vm("not-ours", "c-1", "x");
    other["labels"] = json!({"team": "web"});
    client
        .post(format!("{}projects/p/zones/c-1/instances", fake.api_root()))
        .bearer_auth(&t)
        .json(&other)
        .send()
        .await
        .unwrap();

    let list = |query: Vec<(&'static str, String)>| {
        let client = client.clone();
        let url = format!("{}projects/p/aggregated/instances", fake.api_root());
        let t = t.clone();
        async move {
            let r = client.get(url).bearer_auth(t).query(&query).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let filter = ("filter", "labels.egress-proxies-managed = \"true\"".to_owned());
    let mut names = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut q = vec![filter.clone(), ("maxResults", "3".into())];
        if let Some(t) = &token {
            q.push(("pageToken", t.clone()));
        }
        let (status, page) = list(q).await;
        assert_eq!(status, 200);
        pages += 1;
        for scoped in page["items"].as_object().unwrap().values() {
            for i in scoped["instances"].as_array().into_iter().flatten() {
                names.push(i["name"].as_str().unwrap().to_owned());
            }
        }
        match page["nextPageToken"].as_str() {
            Some(t) => token = Some(t.to_owned()),
            None => break,
        }
    }
    names.sort();
    assert_eq!(
        names,
        ["vm-0", "vm-1", "vm-2", "vm-3"],
        "the filter keeps ours, paging loses none"
    );
    assert_eq!(pages, 2);

    fake.state().unreachable_zones.insert("b-1".into());
    let (status, _) = list(vec![filter.clone()]).await;
    assert_eq!(
        status, 503,
        "unreachable zones fail the call without returnPartialSuccess"
    );
    let (status, page) = list(vec![filter.clone(), ("returnPartialSuccess", "true".into())]).await;
    assert_eq!(status, 200);
    assert_eq!(page["unreachables"], json!(["zones/b-1"]));
    assert!(page["items"].get("zones/b-1").is_none());
    assert_eq!(page["items"]["zones/a-1"]["instances"][0]["name"], "vm-0");
    let (status, _) = list(vec![
        ("filter", "name = vm-0".into()),
        ("returnPartialSuccess", "true".into()),
    ])
    .await;
    assert_eq!(status, 400, "only label filters are understood");
}

#[tokio::test]
async fn set_labels_needs_the_current_fingerprint_replaces_them_all_and_lists_see_it() {
    let fake = FakeCompute::start("p").unwrap();
    let client = client();
    let t = bearer(&fake, &client).await;
    let zone_url = format!("{}projects/p/zones/z-1/instances", fake.api_root());
    for (name, uid) in [("vm-a", "u1"), ("vm-b", "u2")] {
        let r = client
            .post(&zone_url)
            .bearer_auth(&t)
            .json(&vm(name, "z-1", uid))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let get = |name: &'static str| {
        let (client, url, t) = (client.clone(), format!("{zone_url}/{name}"), t.clone());
        async move {
            client
                .get(url)
                .bearer_auth(t)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let set = |name: &'static str, body: Value| {
        let (client, url, t) = (client.clone(), format!("{zone_url}/{name}/setLabels"), t.clone());
        async move {
            let r = client.post(url).bearer_auth(t).json(&body).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let list = |label: &'static str| {
        let client = client.clone();
        let url = format!("{}projects/p/aggregated/instances", fake.api_root());
        let t = t.clone();
        async move {
            let page: Value = client
                .get(url)
                .bearer_auth(t)
                .query(&[("filter", format!("labels.{label} = \"true\""))])
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let mut names: Vec<String> = page["items"]
                .as_object()
                .unwrap()
                .values()
                .flat_map(|s| s["instances"].as_array().cloned().unwrap_or_default())
                .map(|i| i["name"].as_str().unwrap().to_owned())
                .collect();
            names.sort();
            names
        }
    };

    let before = get("vm-a").await;
    let f0 = before["labelFingerprint"].as_str().unwrap().to_owned();
    assert!(!f0.is_empty());
    assert_ne!(
        get("vm-b").await["labelFingerprint"].as_str().unwrap(),
        f0,
        "the fingerprint follows the labels (vm-b's UID differs)"
    );
    let released = json!({"egress-proxies-uid": "u1", "egress-proxies-released": "true"});

    // The fingerprint is required and must be the current one.
    for body in [
        json!({"labels": released}),
        json!({"labels": released, "labelFingerprint": "c3RhbGUtZnA="}),
    ] {
        let (status, answer) = set("vm-a", body).await;
        assert_eq!(status, 412, "{answer}");
        assert_eq!(answer["error"]["errors"][0]["reason"], "conditionNotMet");
    }
    assert_eq!(
        get("vm-a").await["labels"],
        before["labels"],
        "refused: unchanged"
    );

    let (status, op) = set("vm-a", json!({"labels": released, "labelFingerprint": f0})).await;
    assert_eq!(status, 200, "{op}");
    assert_eq!(
        (op["kind"].as_str(), op["operationType"].as_str()),
        (Some("compute#operation"), Some("setLabels"))
    );
    let after = get("vm-a").await;
    assert_eq!(
        after["labels"], released,
        "replaced wholesale: the managed label is gone"
    );
    let f1 = after["labelFingerprint"].as_str().unwrap().to_owned();
    assert_ne!(f1, f0, "the fingerprint changes with the labels");
    let (status, _) = set("vm-a", json!({"labels": {}, "labelFingerprint": f0})).await;
    assert_eq!(status, 412, "the old fingerprint is stale now");

    // Lists filter on the new labels.
    assert_eq!(list("egress-proxies-managed").await, ["vm-b"]);
    assert_eq!(list("egress-proxies-released").await, ["vm-a"]);

    // Labels are validated like insert's; an unknown instance is 404.
    let (status, answer) = set(
        "vm-a",
        json!({"labels": {"Bad.Key": "x"}, "labelFingerprint": f1}),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(get("vm-a").await["labels"], released);
    let (status, _) = set("vm-zz", json!({"labels": {}, "labelFingerprint": f1})).await;
    assert_eq!(status, 404);

    // Another client's change landing first makes a fingerprint read before it stale.
    fake.state()
        .race_next_set_labels("z-1", "vm-a", json!({"egress-proxies-uid": "u1", "team": "web"}));
    let (status, _) = set("vm-a", json!({"labels": {}, "labelFingerprint": f1})).await;
    assert_eq!(status, 412);
    let raced = get("vm-a").await;
    assert_eq!(
        raced["labels"],
        json!({"egress-proxies-uid": "u1", "team": "web"})
    );
    let (status, _) = set(
        "vm-a",
        json!({"labels": {}, "labelFingerprint": raced["labelFingerprint"]}),
    )
    .await;
    assert_eq!(status, 200, "with the fresh fingerprint it goes through");
    assert_eq!(get("vm-a").await["labels"], json!({}));

    let state = fake.state();
    let statuses: Vec<u16> = state.label_sets.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        statuses,
        [412, 412, 200, 412, 400, 412, 200],
        "the 404 never reached an instance"
    );
}
