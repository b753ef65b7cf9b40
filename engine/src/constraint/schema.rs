//! JSON schemas read as llama.cpp reads them: an object schema that lists `properties` and
//! says nothing of `additionalProperties` admits no other key (JSON Schema itself would admit
//! any), so a constrained reply holds exactly the keys a tool or format describes.

use serde_json::Value;

/// Sets `"additionalProperties": false` on every object schema in `schema` that has
/// `properties` and no `additionalProperties`, following the schema's structure (properties,
/// items, combinators, definitions), never the property names themselves.
pub(crate) fn close_objects(schema: &mut Value) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    if obj.get("properties").is_some_and(Value::is_object)
        && !obj.contains_key("additionalProperties")
    {
        obj.insert("additionalProperties".into(), Value::Bool(false));
    }
    // Keywords whose value is a schema.
    for key in [
        "items",
        "additionalProperties",
        "not",
        "if",
        "then",
        "else",
        "contains",
        "additionalItems",
        "unevaluatedProperties",
        "propertyNames",
    ] {
        if let Some(v) = obj.get_mut(key) {
            match v {
                Value::Array(list) => list.iter_mut().for_each(close_objects),
                v => close_objects(v),
            }
        }
    }
    // Keywords whose value is a list of schemas.
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(list)) = obj.get_mut(key) {
            list.iter_mut().for_each(close_objects);
        }
    }
    // Keywords whose value maps names to schemas.
    for key in [
        "properties",
        "patternProperties",
        "$defs",
        "definitions",
        "dependentSchemas",
    ] {
        if let Some(Value::Object(map)) = obj.get_mut(key) {
            map.values_mut().for_each(close_objects);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn objects_with_properties_are_closed_and_names_are_left_alone() {
        let mut s = json!({
            "type": "object",
            "properties": {
                // A property named like a keyword is a name, not a schema keyword.
                "properties": { "type": "object", "properties": { "a": { "type": "string" } } },
                "open": { "type": "object", "properties": {}, "additionalProperties": true },
                "list": { "type": "array", "items": { "properties": { "b": {} } } },
                "any": { "anyOf": [{ "properties": { "c": {} } }, { "type": "string" }] },
                "free": { "type": "object" }
            },
            "$defs": { "d": { "properties": { "e": {} } } }
        });
        close_objects(&mut s);
        assert_eq!(s["additionalProperties"], false);
        let p = &s["properties"];
        assert!(p.get("additionalProperties").is_none(), "{p}");
        assert_eq!(p["properties"]["additionalProperties"], false);
        assert_eq!(p["open"]["additionalProperties"], true);
        assert_eq!(p["list"]["items"]["additionalProperties"], false);
        assert_eq!(p["any"]["anyOf"][0]["additionalProperties"], false);
        assert!(p["any"]["anyOf"][1].get("additionalProperties").is_none());
        assert!(p["free"].get("additionalProperties").is_none());
        assert_eq!(s["$defs"]["d"]["additionalProperties"], false);
    }
}
