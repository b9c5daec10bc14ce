//! The `kubectl get px` and `kubectl get pp` tables, for
//! `egress-proxies-operator get proxies` and `get pools`, and the gateway's
//! `get sites` table.

use jiff::Timestamp;

use egress_proxies_telemetry::gateway_stats::SiteSummary;

use super::{Proxy, ProxyPool};

/// Renders NAME MODE PROVIDER PHASE IP HEALTHY AGE (plus NAMESPACE when
/// several namespaces are shown, and MESSAGE when `wide`), aligned like kubectl.
pub fn proxy_table(proxies: &[Proxy], now: Timestamp, wide: bool) -> String {
    let namespaces: std::collections::BTreeSet<_> = proxies
        .iter()
        .map(|p| p.metadata.namespace.as_deref().unwrap_or("default"))
        .collect();
    let with_ns = namespaces.len() > 1;
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut header = vec!["NAME", "MODE", "PROVIDER", "PHASE", "IP", "HEALTHY", "AGE"];
    if with_ns {
        header.insert(0, "NAMESPACE");
    }
    if wide {
        header.push("MESSAGE");
    }
    rows.push(header.into_iter().map(str::to_owned).collect());
    for p in proxies {
        let status = p.status.clone().unwrap_or_default();
        let mut row = vec![
            p.metadata.name.clone().unwrap_or_default(),
            p.spec.mode.as_str().to_owned(),
            p.spec.provider.clone().unwrap_or_default(),
            status.phase.map(|ph| ph.as_str().to_owned()).unwrap_or_default(),
            status.ip.clone().unwrap_or_default(),
            status
                .health
                .as_ref()
                .map(|h| h.healthy.to_string())
                .unwrap_or_default(),
            p.metadata
                .creation_timestamp
                .as_ref()
                .map(|t| age(now.duration_since(t.0).as_secs()))
                .unwrap_or_else(|| "<unknown>".into()),
        ];
        if with_ns {
            row.insert(
                0,
                p.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            );
        }
        if wide {
            // One line per proxy, whatever the message holds.
            let message = status.message.clone().unwrap_or_default();
            row.push(message.split_whitespace().collect::<Vec<_>>().join(" "));
        }
        rows.push(row);
    }
    aligned(rows)
}

/// Renders NAME DESIRED REPLICAS READY LEASED ROTATING AGE of each pool
/// (plus NAMESPACE when several namespaces are shown).
pub fn pool_table(pools: &[ProxyPool], now: Timestamp) -> String {
    let namespaces: std::collections::BTreeSet<_> = pools
        .iter()
        .map(|p| p.metadata.namespace.as_deref().unwrap_or("default"))
        .collect();
    let with_ns = namespaces.len() > 1;
    let mut header = vec![
        "NAME", "DESIRED", "REPLICAS", "READY", "LEASED", "ROTATING", "AGE",
    ];
    if with_ns {
        header.insert(0, "NAMESPACE");
    }
    let mut rows: Vec<Vec<String>> = vec![header.into_iter().map(str::to_owned).collect()];
    for p in pools {
        let status = p.status.clone().unwrap_or_default();
        let mut row = vec![
            p.metadata.name.clone().unwrap_or_default(),
            status.desired_replicas.unwrap_or(p.spec.replicas).to_string(),
            status.replicas.to_string(),
            status.ready.to_string(),
            status.leased.to_string(),
            status.rotating.to_string(),
            p.metadata
                .creation_timestamp
                .as_ref()
                .map(|t| age(now.duration_since(t.0).as_secs()))
                .unwrap_or_else(|| "<unknown>".into()),
        ];
        if with_ns {
            row.insert(
                0,
                p.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            );
        }
        rows.push(row);
    }
    aligned(rows)
}

/// Columns padded to their widest cell, three spaces apart, like kubectl.
pub fn aligned(rows: Vec<Vec<String>>) -> String {
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// `get sites`: SITE REQUESTS FIRST-TRY PROXIES AVOIDED, aligned like
/// kubectl; each proxy with its recent success rate, the best first.
pub fn site_table(sites: &[SiteSummary]) -> String {
    let mut rows = vec![
        ["SITE", "REQUESTS", "FIRST-TRY", "PROXIES", "AVOIDED"]
            .map(str::to_owned)
            .to_vec(),
    ];
    for site in sites {
        let percent = |rate: f64| format!("{:.0}%", rate * 100.0);
        let first_try = if site.requests == 0 {
            "-".to_owned()
        } else {
            percent(site.first_try_served as f64 / site.requests as f64)
        };
        let listed = |avoided: bool| {
            let names: Vec<String> = site
                .proxies
                .iter()
                .filter(|p| p.avoided == avoided)
                .map(|p| format!("{}={}", p.proxy, percent(p.success_rate)))
                .collect();
            if names.is_empty() {
                "-".to_owned()
            } else {
                names.join(",")
            }
        };
        rows.push(vec![
            site.site.clone(),
            site.requests.to_string(),
            first_try,
            listed(false),
            listed(true),
        ]);
    }
    aligned(rows)
}

/// kubectl's short ages: 45s, 12m, 3h, 5d.
fn age(secs: i64) -> String {
    let secs = secs.max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{Mode, Phase, ProxySpec, ProxyStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn renders_aligned_rows_with_ages() {
        let now = Timestamp::from_second(1_000_000).unwrap();
        let mut p = Proxy::new(
            "eu-1",
            ProxySpec {
                mode: Mode::Managed,
                provider: Some("local".into()),
                placement: None,
                port: 3128,
                cloud_init: None,
                endpoint: None,
                attributes: Default::default(),
                health_check: None,
            },
        );
        p.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_000_000 - 300).unwrap()));
        p.status = Some(ProxyStatus {
            phase: Some(Phase::Running),
            ip: Some("127.0.0.1".into()),
            ..Default::default()
        });
        let table = proxy_table(std::slice::from_ref(&p), now, false);
        assert_eq!(
            table,
            "NAME   MODE      PROVIDER   PHASE     IP          HEALTHY   AGE\n\
             eu-1   Managed   local      Running   127.0.0.1             5m\n"
        );
        p.status = Some(ProxyStatus {
            phase: Some(Phase::Pending),
            message: Some(
                "kvm-home create: transient: host dc1:\n  SSH connection refused (will retry)".into(),
            ),
            ..Default::default()
        });
        let wide = proxy_table(&[p], now, true);
        assert_eq!(
            wide,
            "NAME   MODE      PROVIDER   PHASE     IP   HEALTHY   AGE   MESSAGE\n\
             eu-1   Managed   local      Pending                  5m    kvm-home create: transient: host dc1: SSH connection refused (will retry)\n"
        );
        assert_eq!(age(59), "59s");
        assert_eq!(age(7199), "119m");
        assert_eq!(age(7200), "2h");
        assert_eq!(age(200_000), "2d");
    }

    #[test]
    fn pools_render_with_their_counts() {
        let now = Timestamp::from_second(1_000_000).unwrap();
        let mut pool: ProxyPool = serde_json::from_value(serde_json::json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
            "metadata": {"name": "eu", "namespace": "crawl"},
            "spec": {"replicas": 3, "template": {"spec": {"mode": "Managed", "provider": "local"}}}
        }))
        .unwrap();
        pool.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_000_000 - 7200).unwrap()));
        pool.status = Some(crate::resource::ProxyPoolStatus {
            replicas: 4,
            ready: 3,
            leased: 2,
            rotating: 1,
            desired_replicas: Some(5),
            ..Default::default()
        });
        assert_eq!(
            pool_table(&[pool], now),
            "NAME   DESIRED   REPLICAS   READY   LEASED   ROTATING   AGE\n\
             eu     5         4          3       2        1          2h\n"
        );
    }
}
