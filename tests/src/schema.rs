//! The committed JSON Schemas (docs/DOCUMENT.schema.json) applied to real output, strictly.

use std::path::PathBuf;

use serde_json::Value;

/// What `doc` breaks of docs/`document`.schema.json, every object of the schema closed: the
/// committed schema leaves objects open, so that a reader of an older schema accepts a field
/// added later, but our own output must have nothing the schema does not describe (a `demo`
/// object the summary's schema knows nothing of passed it, issue 13).
pub fn schema_errors(doc: &Value, document: &str) -> Vec<String> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../docs/{document}.schema.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (`cargo xtask schema` writes it)", path.display()));
    let mut schema: Value = serde_json::from_str(&text).expect("the schema is JSON");
    close_objects(&mut schema);
    let validator = jsonschema::validator_for(&schema).expect("a valid JSON Schema");
    validator
        .iter_errors(doc)
        .map(|e| format!("at {}: {e}", e.instance_path()))
        .collect()
}

/// Panics with every error when `doc` does not match docs/`document`.schema.json (strictly).
pub fn assert_matches_schema(doc: &Value, document: &str, what: &str) {
    let errors = schema_errors(doc, document);
    assert!(
        errors.is_empty(),
        "{what}: the document does not match docs/{document}.schema.json:\n{}",
        errors.join("\n")
    );
}

/// Closes every object schema that lists its properties. Most get `additionalProperties:
/// false`. An object whose properties continue in `oneOf`/`anyOf` branches (a flattened
/// enum: a cause's `mechanism_id` and `mechanism_data`) gets `unevaluatedProperties: false`
/// instead, which counts what the matching branch describes, and its branches are left open
/// (closed, each would reject the properties listed beside it). There is no `allOf` to close:
/// schemars inlines serde's flatten of structs.
pub fn close_objects(v: &mut Value) {
    close(v, false);
}

fn close(v: &mut Value, branch: bool) {
    match v {
        Value::Object(m) => {
            assert!(
                !m.contains_key("allOf"),
                "an allOf in the schema: close its union of properties instead"
            );
            let union = m.contains_key("oneOf") || m.contains_key("anyOf");
            if !branch && m.contains_key("properties") && !m.contains_key("additionalProperties") {
                let key = if union {
                    "unevaluatedProperties"
                } else {
                    "additionalProperties"
                };
                m.insert(key.into(), Value::Bool(false));
            }
            let closes_itself = union && m.contains_key("properties");
            for (k, sub) in m.iter_mut() {
                match (k.as_str(), sub) {
                    ("oneOf" | "anyOf", Value::Array(branches)) if closes_itself => {
                        branches.iter_mut().for_each(|b| close(b, true))
                    }
                    (_, sub) => close(sub, false),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| close(x, false)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cause as the summary has it: the mechanism's id and data come from a flattened enum.
    fn cause(extra: Option<(&str, Value)>) -> Value {
        let mut c = serde_json::json!({
            "cause": "scheduling",
            "mechanism": "run-queue contention among its own threads",
            "mechanism_id": "run_queue_contention",
            "mechanism_data": {"by": [{"kind": "target", "name": "server", "pids": [7],
                                        "process_count": 1, "wait_share": 0.5}]},
            "share": 1.0,
            "attributed_ns": 1000.0,
            "evidence": "e",
            "acts_in": {"pid": 7, "role": "server", "comm": "server", "share": 1.0},
            "advice": "a"
        });
        if let Some((k, v)) = extra {
            c[k] = v;
        }
        c
    }

    fn errors(c: &Value) -> Vec<String> {
        let text = std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/summary.schema.json"),
        )
        .unwrap();
        let mut schema: Value = serde_json::from_str(&text).unwrap();
        let mut cause_schema = schema["$defs"]["Cause"].clone();
        cause_schema["$defs"] = schema["$defs"].take();
        close_objects(&mut cause_schema);
        let v = jsonschema::validator_for(&cause_schema).unwrap();
        v.iter_errors(c).map(|e| e.to_string()).collect()
    }

    #[test]
    fn a_cause_with_its_mechanism_id_passes_strictly_and_an_unknown_field_does_not() {
        assert_eq!(errors(&cause(None)), Vec::<String>::new());
        assert!(!errors(&cause(Some(("bogus", Value::Bool(true))))).is_empty());
        let mut c = cause(None);
        c["mechanism_data"]["by"][0]["bogus"] = Value::Bool(true);
        assert!(!errors(&c).is_empty(), "inside the branch too");
        c = cause(None);
        c["mechanism_id"] = "cgroup_throttling".into();
        assert!(!errors(&c).is_empty(), "data that is not that mechanism's");
    }
}
