//! Request bodies in Kubernetes' protobuf encoding
//! (`application/vnd.kubernetes.protobuf`), which kubectl's typed commands
//! send for built-in kinds (`kubectl create secret`, `create configmap`,
//! `create namespace`). Decoded into the JSON the rest of the fake works on,
//! for the kinds and fields those commands write: object metadata (name,
//! generateName, namespace, labels, annotations, finalizers), Secret
//! (`data`, `stringData`, `type`, `immutable`), ConfigMap (`data`,
//! `binaryData`, `immutable`) and Namespace (`spec.finalizers`). Any other
//! kind answers `415`, as a server without a protobuf codec for it would.
//! Answers stay JSON: kubectl accepts both.
//!
//! The envelope: the bytes `k8s\0`, then a `runtime.Unknown` message
//! (1: typeMeta {1: apiVersion, 2: kind}, 2: raw, the object's own message).

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::state::ApiError;

pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
const MAGIC: &[u8] = b"k8s\0";

/// One field of a message: its number and value.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn invalid(why: &str) -> ApiError {
    ApiError::new(400, "BadRequest", format!("invalid protobuf body: {why}"))
}

fn varint(buf: &[u8], at: &mut usize) -> Result<u64, ApiError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*at).ok_or_else(|| invalid("truncated varint"))?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(invalid("varint too long"))
}

/// The fields of one message, in order.
fn fields(buf: &[u8]) -> Result<Vec<(u64, Field<'_>)>, ApiError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        let key = varint(buf, &mut at)?;
        let (number, wire) = (key >> 3, key & 7);
        let value = match wire {
            0 => Field::Varint(varint(buf, &mut at)?),
            2 => {
                let len = usize::try_from(varint(buf, &mut at)?).map_err(|_| invalid("length"))?;
                let end = at
                    .checked_add(len)
                    .filter(|e| *e <= buf.len())
                    .ok_or_else(|| invalid("truncated field"))?;
                let bytes = &buf[at..end];
                at = end;
                Field::Bytes(bytes)
            }
            1 => {
                at += 8;
                Field::Varint(0)
            }
            5 => {
                at += 4;
                Field::Varint(0)
            }
            other => return Err(invalid(&format!("wire type {other}"))),
        };
        out.push((number, value));
    }
    Ok(out)
}

fn text(bytes: &[u8]) -> Result<String, ApiError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| invalid("a string that is not UTF-8"))
}

/// A map entry message (1: key, 2: value) as its key and raw value.
fn entry(bytes: &[u8]) -> Result<(String, Vec<u8>), ApiError> {
    let mut key = String::new();
    let mut value = Vec::new();
    for (number, field) in fields(bytes)? {
        match (number, field) {
            (1, Field::Bytes(b)) => key = text(b)?,
            (2, Field::Bytes(b)) => value = b.to_vec(),
            _ => {}
        }
    }
    Ok((key, value))
}

fn string_map(entries: &[(String, Vec<u8>)]) -> Result<Value, ApiError> {
    let mut map = Map::new();
    for (k, v) in entries {
        map.insert(k.clone(), json!(text(v)?));
    }
    Ok(Value::Object(map))
}

fn base64_map(entries: &[(String, Vec<u8>)]) -> Value {
    let map: BTreeMap<&String, String> = entries
        .iter()
        .map(|(k, v)| (k, data_encoding::BASE64.encode(v)))
        .collect();
    json!(map)
}

fn object_meta(bytes: &[u8]) -> Result<Value, ApiError> {
    let mut meta = Map::new();
    let (mut labels, mut annotations, mut finalizers) = (Vec::new(), Vec::new(), Vec::new());
    for (number, field) in fields(bytes)? {
        let Field::Bytes(b) = field else { continue };
        match number {
            1 => _ = meta.insert("name".into(), json!(text(b)?)),
            2 => _ = meta.insert("generateName".into(), json!(text(b)?)),
            3 => _ = meta.insert("namespace".into(), json!(text(b)?)),
            11 => labels.push(entry(b)?),
            12 => annotations.push(entry(b)?),
            14 => finalizers.push(json!(text(b)?)),
            _ => {}
        }
    }
    meta.retain(|_, v| v.as_str() != Some(""));
    if !labels.is_empty() {
        meta.insert("labels".into(), string_map(&labels)?);
    }
    if !annotations.is_empty() {
        meta.insert("annotations".into(), string_map(&annotations)?);
    }
    if !finalizers.is_empty() {
        meta.insert("finalizers".into(), json!(finalizers));
    }
    Ok(Value::Object(meta))
}

/// The JSON object a protobuf request body encodes.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let unknown = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| invalid("no k8s envelope"))?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for (number, field) in fields(unknown)? {
        match (number, field) {
            (1, Field::Bytes(type_meta)) => {
                for (n, f) in fields(type_meta)? {
                    match (n, f) {
                        (1, Field::Bytes(b)) => api_version = text(b)?,
                        (2, Field::Bytes(b)) => kind = text(b)?,
                        _ => {}
                    }
                }
            }
            (2, Field::Bytes(b)) => raw = b,
            _ => {}
        }
    }
    if !matches!(kind.as_str(), "Secret" | "ConfigMap" | "Namespace") {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "this fake decodes protobuf bodies of Secrets, ConfigMaps and Namespaces only (got {kind}); send JSON"
            ),
        ));
    }
    let mut object = json!({"apiVersion": api_version, "kind": kind});
    let (mut first_map, mut second_map) = (Vec::new(), Vec::new());
    for (number, field) in fields(raw)? {
        match (kind.as_str(), number, field) {
            (_, 1, Field::Bytes(b)) => object["metadata"] = object_meta(b)?,
            ("Secret" | "ConfigMap", 2, Field::Bytes(b)) => first_map.push(entry(b)?),
            ("Secret", 3, Field::Bytes(b)) if !b.is_empty() => object["type"] = json!(text(b)?),
            ("Secret", 4, Field::Bytes(b)) | ("ConfigMap", 3, Field::Bytes(b)) => second_map.push(entry(b)?),
            ("Secret", 5, Field::Varint(v)) | ("ConfigMap", 4, Field::Varint(v)) => {
                object["immutable"] = json!(v != 0)
            }
            ("Namespace", 2, Field::Bytes(spec)) => {
                let finalizers: Result<Vec<Value>, ApiError> = fields(spec)?
                    .into_iter()
                    .filter_map(|(n, f)| match (n, f) {
                        (1, Field::Bytes(b)) => Some(text(b).map(Value::from)),
                        _ => None,
                    })
                    .collect();
                object["spec"] = json!({"finalizers": finalizers?});
            }
            _ => {}
        }
    }
    match kind.as_str() {
        "Secret" => {
            if !first_map.is_empty() {
                object["data"] = base64_map(&first_map);
            }
            if !second_map.is_empty() {
                object["stringData"] = string_map(&second_map)?;
            }
        }
        "ConfigMap" => {
            if !first_map.is_empty() {
                object["data"] = string_map(&first_map)?;
            }
            if !second_map.is_empty() {
                object["binaryData"] = base64_map(&second_map);
            }
        }
        _ => {}
    }
    Ok(object)
}
