//! The contracts, published: a JSON Schema per type and major (draft 2020-12), and an
//! AsyncAPI 3 document of the surfaces that carry them (the relay's NATS subjects and the
//! server's SSE stream), one message per type and major.

use serde_json::{Map, Value, json};

use super::{Contract, FieldType, Fields, subject_token};

/// The pattern of an RFC 3339 time with an offset, as `write_event` checks it.
const TIMESTAMP_PATTERN: &str = "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$";
/// The identifier rule's character class.
const IDENTIFIER_PATTERN: &str = "^[A-Za-z0-9._:@-]+$";

/// The `$id` of a contract's schema, also carried as `ce-dataschema` on every message.
pub fn schema_id(contract: &Contract) -> String {
    schema_urn(contract.event_type.as_str(), contract.major as i64)
}

/// The `$id` of the schema of `event_type` at `major`: `urn:lifecycle-outbox:contract:<type>:<major>`.
pub fn schema_urn(event_type: &str, major: i64) -> String {
    format!("urn:lifecycle-outbox:contract:{event_type}:{major}")
}

/// The JSON Schema (draft 2020-12) of a contract's payload.
pub fn json_schema(contract: &Contract) -> Value {
    let mut schema = object_schema(&contract.fields);
    let map = schema.as_object_mut().expect("an object schema");
    map.insert(
        "$schema".into(),
        "https://json-schema.org/draft/2020-12/schema".into(),
    );
    map.insert("$id".into(), schema_id(contract).into());
    map.insert(
        "title".into(),
        format!("{}.{}", contract.reference(), contract.minor).into(),
    );
    map.insert("description".into(), contract.description.clone().into());
    schema
}

fn object_schema(fields: &Fields) -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for (name, spec) in fields {
        properties.insert(name.clone(), field_schema(&spec.field_type));
        if spec.required {
            required.push(Value::from(name.clone()));
        }
    }
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": required,
        "properties": properties,
    })
}

fn field_schema(field_type: &FieldType) -> Value {
    match field_type {
        FieldType::Identifier { max_length } => json!({
            "type": "string", "pattern": IDENTIFIER_PATTERN,
            "minLength": 1, "maxLength": max_length,
        }),
        FieldType::Timestamp => json!({
            "type": "string", "format": "date-time", "pattern": TIMESTAMP_PATTERN,
        }),
        FieldType::Integer { minimum, maximum } => json!({
            "type": "integer",
            "minimum": minimum.unwrap_or(i64::MIN),
            "maximum": maximum.unwrap_or(i64::MAX),
        }),
        FieldType::Boolean => json!({"type": "boolean"}),
        FieldType::Enum { values } => json!({"type": "string", "enum": values}),
        FieldType::Object { fields } => object_schema(fields),
    }
}

/// An AsyncAPI 3.0 document for `contracts`: the relay's subjects under `subject_prefix`
/// (one channel per type, `<prefix>.{project}.<noun_verb>`), the server's SSE stream
/// (`/v1/projects/{project}/events`, the `event:` field being the type), and one message per
/// type and major whose payload is the line a consumer receives with the contract's schema
/// as its `payload`, and whose headers are the CloudEvents binary-mode headers.
pub fn asyncapi(contracts: &[Contract], subject_prefix: &str) -> Value {
    let mut channels = Map::new();
    let mut operations = Map::new();
    let mut messages = Map::new();
    let mut sse_messages = Map::new();
    let mut types: Vec<&str> = contracts.iter().map(|c| c.event_type.as_str()).collect();
    types.dedup();
    for event_type in types {
        let token = subject_token(event_type);
        let mut channel_messages = Map::new();
        for contract in contracts
            .iter()
            .filter(|c| c.event_type.as_str() == event_type)
        {
            let key = format!("{token}_v{}", contract.major);
            let reference = json!({"$ref": format!("#/components/messages/{key}")});
            channel_messages.insert(key.clone(), reference.clone());
            sse_messages.insert(key.clone(), reference);
            messages.insert(key, message(contract));
        }
        let channel = format!("nats_{token}");
        channels.insert(
            channel.clone(),
            json!({
                "address": format!("{subject_prefix}.{{project}}.{token}"),
                "description": format!(
                    "{event_type} events of one project, in its sequence order, as the relay \
                     publishes them (the project token is the project ID with . * > % escaped)"),
                "parameters": {"project": {"description": "The project's subject token."}},
                "messages": channel_messages,
                "bindings": {"nats": {}},
            }),
        );
        operations.insert(
            format!("receive_{token}"),
            json!({
                "action": "receive",
                "channel": {"$ref": format!("#/channels/{channel}")},
            }),
        );
    }
    channels.insert(
        "sse".into(),
        json!({
            "address": "/v1/projects/{project}/events",
            "description": "Server-sent events of one project from `outbox serve`; each \
                            frame's `event:` is the event type and `id:` its sequence.",
            "parameters": {"project": {"description": "The project ID."}},
            "messages": sse_messages,
        }),
    );
    operations.insert(
        "receive_sse".into(),
        json!({"action": "receive", "channel": {"$ref": "#/channels/sse"}}),
    );
    json!({
        "asyncapi": "3.0.0",
        "info": {
            "title": "lifecycle-outbox events",
            "version": contracts.iter().map(|c| format!("{}.{}", c.reference(), c.minor))
                .collect::<Vec<_>>().join(" "),
            "description": "Every event type and major version registered in the outbox's \
                            contract registry.",
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    })
}

fn message(contract: &Contract) -> Value {
    let header = |description: &str| json!({"type": "string", "description": description});
    json!({
        "name": format!("{}@{}", contract.event_type, contract.major),
        "title": contract.reference().to_string(),
        "summary": contract.description,
        "contentType": "application/json",
        "headers": {
            "type": "object",
            "properties": {
                "ce-specversion": {"type": "string", "const": "1.0"},
                "ce-id": header("The event ID."),
                "ce-source": header("The outbox and project the event came from."),
                "ce-type": {"type": "string", "const": contract.event_type.as_str()},
                "ce-time": header("When the event was written (RFC 3339)."),
                "ce-subject": header("The event's subject (the task ID)."),
                "ce-sequence": header("The project's sequence number, zero-padded to 20 digits."),
                "ce-dataschema": {"type": "string", "const": schema_id(contract)},
                "traceparent": header("The writer's W3C trace context, when it passed one."),
            },
        },
        "payload": {
            "type": "object",
            "description": "The line a consumer receives; `payload` is the contract's payload.",
            "required": ["event_type", "type_major", "type_minor", "event_id", "sequence",
                         "task_id", "payload"],
            "properties": {
                "event_type": {"type": "string", "const": contract.event_type.as_str()},
                "type_major": {"type": "integer", "const": contract.major},
                "type_minor": {"type": "integer", "minimum": 0},
                "event_id": {"type": "string"},
                "sequence": {"type": "integer", "minimum": 1},
                "task_id": {"type": "string"},
                "traceparent": {"type": "string"},
                "payload": json_schema(contract),
            },
        },
    })
}
