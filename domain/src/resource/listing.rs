//! Whole Proxy objects as `get proxies -o yaml|json` prints them: a
//! kubectl-style `List`, with inline cloud-init (which may hold secrets)
//! replaced by its size.

use serde_json::{Value, json};

use super::Proxy;

/// How `get proxies` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListFormat {
    Yaml,
    Json,
}

/// Printing the list failed (a bug in the types, never user input).
#[derive(Debug, thiserror::Error)]
pub enum ListingError {
    #[error("rendering proxies as JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("rendering proxies as YAML: {0}")]
    Yaml(#[from] serde_saphyr::ser::Error),
}

/// The proxies as one `List` document.
pub fn proxy_list(proxies: &[Proxy], format: ListFormat) -> Result<String, ListingError> {
    let items = proxies.iter().map(redacted).collect::<Result<Vec<_>, _>>()?;
    list(items, format)
}

fn list(items: Vec<Value>, format: ListFormat) -> Result<String, ListingError> {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    Ok(match format {
        ListFormat::Json => serde_json::to_string_pretty(&list)? + "\n",
        ListFormat::Yaml => serde_saphyr::to_string(&list)?,
    })
}

/// The pools as a `v1` List, inline cloud-init of their template redacted.
pub fn pool_list(pools: &[super::ProxyPool], format: ListFormat) -> Result<String, ListingError> {
    let items = pools
        .iter()
        .map(|pool| redacted_at(pool, "/spec/template/spec/cloudInit/inline"))
        .collect::<Result<Vec<_>, _>>()?;
    list(items, format)
}

fn redacted(proxy: &Proxy) -> Result<Value, serde_json::Error> {
    redacted_at(proxy, "/spec/cloudInit/inline")
}

/// `object` with the inline cloud-init at `pointer` replaced by its size.
fn redacted_at(object: &impl serde::Serialize, pointer: &str) -> Result<Value, serde_json::Error> {
    let mut value = serde_json::to_value(object)?;
    if let Some(inline) = value.pointer_mut(pointer)
        && let Some(text) = inline.as_str()
    {
        *inline = Value::String(format!("<redacted: {} bytes>", text.len()));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{CloudInit, Mode, Phase, ProxySpec, ProxyStatus};

    fn proxy() -> Proxy {
        let mut p = Proxy::new(
            "eu-1",
            ProxySpec {
                mode: Mode::Managed,
                provider: Some("local".into()),
                placement: None,
                port: 3128,
                cloud_init: Some(CloudInit {
                    inline: Some("#cloud-config\npassword: hunter2\n".into()),
                    secret_ref: None,
                }),
                endpoint: None,
                attributes: Default::default(),
                health_check: None,
            },
        );
        p.status = Some(ProxyStatus {
            phase: Some(Phase::BackOff),
            message: Some("instance stopped: the proxy process exited with status 1".into()),
            ..Default::default()
        });
        p
    }

    #[test]
    fn json_lists_whole_objects_without_inline_cloud_init() {
        let text = proxy_list(&[proxy()], ListFormat::Json).unwrap();
        let list: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(list["kind"], "List");
        let item = &list["items"][0];
        assert_eq!(item["kind"], "Proxy");
        assert_eq!(item["apiVersion"], "crawl.example.com/v1alpha1");
        assert_eq!(item["status"]["phase"], "BackOff");
        assert_eq!(
            item["status"]["message"],
            "instance stopped: the proxy process exited with status 1"
        );
        assert_eq!(item["spec"]["cloudInit"]["inline"], "<redacted: 32 bytes>");
        assert!(!text.contains("hunter2"));
    }

    #[test]
    fn yaml_reads_back_as_the_same_list() {
        let yaml = proxy_list(&[proxy()], ListFormat::Yaml).unwrap();
        assert!(!yaml.contains("hunter2"));
        let back: Value = serde_saphyr::from_str(&yaml).unwrap();
        let json: Value = serde_json::from_str(&proxy_list(&[proxy()], ListFormat::Json).unwrap()).unwrap();
        assert_eq!(back, json);
        assert_eq!(
            proxy_list(&[], ListFormat::Json).unwrap(),
            "{\n  \"apiVersion\": \"v1\",\n  \"items\": [],\n  \"kind\": \"List\"\n}\n"
        );
    }
}
