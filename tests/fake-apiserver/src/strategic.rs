//! Strategic merge patch, as `kubectl apply` sends it for built-in kinds: a
//! JSON merge patch whose lists of objects merge element by element on a
//! merge key rather than being replaced, with the directives kubectl writes.
//!
//! The merge key of a list is read from the patch itself: kubectl sends
//! `$setElementOrder/<list>` (each element reduced to its merge key, e.g.
//! `{"name": "manager"}`) beside every keyed list it changes, so the key is
//! the one field those entries carry. Directives: `$setElementOrder/<list>`
//! (the order of the merged list), `$patch: delete` on a list element
//! (removes the element with that key) or on a map (removes it),
//! `$deleteFromPrimitiveList/<list>` (removes those values) and
//! `$retainKeys` (keeps only the named fields). A list without
//! `$setElementOrder` is replaced, as JSON merge patch does (the type's
//! patch strategy, which only the schema knows, is not consulted).

use serde_json::{Map, Value};

const ORDER: &str = "$setElementOrder/";
const DELETE_PRIMITIVES: &str = "$deleteFromPrimitiveList/";

/// Applies `patch` to `target`.
pub fn apply(target: &mut Value, patch: &Value) {
    let Some(patch) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if patch.get("$patch").and_then(Value::as_str) == Some("delete") {
        *target = Value::Null;
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let object = target.as_object_mut().expect("made an object");
    if let Some(keep) = patch.get("$retainKeys").and_then(Value::as_array) {
        object.retain(|k, _| keep.iter().any(|kept| kept.as_str() == Some(k)));
    }
    for (key, value) in patch {
        if key.starts_with('$') && !key.starts_with(DELETE_PRIMITIVES) {
            continue;
        }
        if let Some(list) = key.strip_prefix(DELETE_PRIMITIVES) {
            if let (Some(items), Some(gone)) = (
                object.get_mut(list).and_then(Value::as_array_mut),
                value.as_array(),
            ) {
                items.retain(|item| !gone.contains(item));
            }
            continue;
        }
        let order = patch.get(&format!("{ORDER}{key}")).and_then(Value::as_array);
        match (value, order) {
            (Value::Null, _) => {
                object.remove(key);
            }
            (Value::Array(items), Some(order)) => {
                let current = object.remove(key).unwrap_or(Value::Array(Vec::new()));
                object.insert(key.clone(), merge_list(current, items, order));
            }
            (Value::Object(_), _) => {
                let slot = object.entry(key.clone()).or_insert(Value::Null);
                apply(slot, value);
                if slot.is_null() {
                    object.remove(key);
                }
            }
            _ => {
                object.insert(key.clone(), value.clone());
            }
        }
    }
    // A `$setElementOrder` whose list the patch leaves alone only orders it.
    for (key, order) in patch {
        if let (Some(list), Some(order)) = (key.strip_prefix(ORDER), order.as_array())
            && !patch.contains_key(list)
            && let Some(current) = object.remove(list)
        {
            object.insert(list.to_owned(), merge_list(current, &[], order));
        }
    }
}

/// The field an `$setElementOrder` entry names: the list's merge key.
fn merge_key(order: &[Value]) -> Option<String> {
    order.first()?.as_object()?.keys().next().cloned()
}

fn merge_list(current: Value, patch: &[Value], order: &[Value]) -> Value {
    let mut items = match current {
        Value::Array(items) => items,
        _ => Vec::new(),
    };
    let Some(key) = merge_key(order) else {
        // A list of primitives: the order lists the values themselves.
        return Value::Array(order.to_vec());
    };
    for element in patch {
        let id = &element[&key];
        let position = items.iter().position(|item| item[&key] == *id);
        if element.get("$patch").and_then(Value::as_str) == Some("delete") {
            if let Some(i) = position {
                items.remove(i);
            }
            continue;
        }
        match position {
            Some(i) => apply(&mut items[i], element),
            None => {
                let mut fresh = Value::Null;
                apply(&mut fresh, element);
                items.push(fresh);
            }
        }
    }
    // The order kubectl asks for; elements it does not name keep theirs, after.
    let mut ordered = Vec::new();
    for wanted in order {
        if let Some(i) = items.iter().position(|item| item[&key] == wanted[&key]) {
            ordered.push(items.remove(i));
        }
    }
    ordered.extend(items);
    Value::Array(ordered)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::apply;

    #[test]
    fn keyed_lists_merge_by_key_in_the_order_asked() {
        let mut deployment = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "manager", "image": "op:0.1.0", "args": ["run"], "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
            {"name": "sidecar", "image": "s:1"}
        ]}}}});
        let patch = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "manager"}, {"name": "sidecar"}],
            "containers": [{"name": "manager", "image": "op:0.2.0",
                            "$setElementOrder/env": [{"name": "B"}, {"name": "C"}],
                            "env": [{"name": "A", "$patch": "delete"}, {"name": "C", "value": "3"}]}]
        }}}});
        apply(&mut deployment, &patch);
        assert_eq!(
            deployment,
            json!({"spec": {"template": {"spec": {"containers": [
                {"name": "manager", "image": "op:0.2.0", "args": ["run"], "env": [{"name": "B", "value": "2"}, {"name": "C", "value": "3"}]},
                {"name": "sidecar", "image": "s:1"}
            ]}}}})
        );
    }

    #[test]
    fn directives_for_maps_primitives_and_retained_keys() {
        let mut object = json!({"metadata": {"finalizers": ["a", "b"], "labels": {"x": "1"}},
                                "spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}, "gone": {"k": 1}}});
        let patch = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"], "labels": {"x": null, "y": "2"}},
                           "spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}, "gone": {"$patch": "delete"}}});
        apply(&mut object, &patch);
        assert_eq!(
            object,
            json!({"metadata": {"finalizers": ["b"], "labels": {"y": "2"}}, "spec": {"strategy": {"type": "Recreate"}}})
        );
    }
}
