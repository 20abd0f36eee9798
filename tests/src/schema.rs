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

/// Gives every object schema that lists its properties `additionalProperties: false`. That
/// holds while the generated schemas have no `allOf` (schemars inlines serde's flatten): a
/// closed branch of one would reject the properties the other branches describe.
fn close_objects(v: &mut Value) {
    match v {
        Value::Object(m) => {
            assert!(
                !m.contains_key("allOf"),
                "an allOf in the schema: close its union of properties instead"
            );
            if m.contains_key("properties") && !m.contains_key("additionalProperties") {
                m.insert("additionalProperties".into(), Value::Bool(false));
            }
            m.values_mut().for_each(close_objects);
        }
        Value::Array(a) => a.iter_mut().for_each(close_objects),
        _ => {}
    }
}
