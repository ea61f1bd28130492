//! MQTT 5.0 PUBLISH properties: the protocol's JSON keys to rumqttc's `PublishProperties`, and back.

use crate::command::uint;
use rumqttc::v5::mqttbytes::v5::PublishProperties;
use serde_json::{Map, Value};

/// The `properties` of a publish command. A null value counts as absent.
pub fn from_json(json: &Map<String, Value>) -> Result<PublishProperties, String> {
    let mut properties = PublishProperties::default();
    for (key, value) in json.iter().filter(|(_, value)| !value.is_null()) {
        set(&mut properties, key, value).map_err(|why| format!("publish property '{key}': {why}"))?;
    }
    Ok(properties)
}

fn set(properties: &mut PublishProperties, key: &str, value: &Value) -> Result<(), String> {
    match key {
        "user_properties" => properties.user_properties = user_properties(value)?,
        "response_topic" => properties.response_topic = Some(text(value)?.to_string()),
        "correlation_data" => properties.correlation_data = Some(from_hex(text(value)?)?.into()),
        "content_type" => properties.content_type = Some(text(value)?.to_string()),
        "payload_format" => properties.payload_format_indicator = Some(uint(value, 1)?),
        "message_expiry" => properties.message_expiry_interval = Some(uint(value, u32::MAX)?),
        "topic_alias" => match uint(value, u16::MAX)? {
            0 => return Err("a topic alias is at least 1".into()),
            alias => properties.topic_alias = Some(alias),
        },
        _ => return Err("not a property this driver knows".into()),
    }
    Ok(())
}

/// The properties of a received message, with the keys it carried only.
pub fn to_json(properties: &PublishProperties) -> Map<String, Value> {
    let mut json = Map::new();
    if !properties.user_properties.is_empty() {
        let pairs =
            properties.user_properties.iter().map(|(key, value)| Value::from(vec![key.as_str(), value.as_str()]));
        json.insert("user_properties".into(), pairs.collect());
    }
    if let Some(topic) = &properties.response_topic {
        json.insert("response_topic".into(), topic.as_str().into());
    }
    if let Some(data) = &properties.correlation_data {
        json.insert("correlation_data".into(), to_hex(data).into());
    }
    if let Some(content_type) = &properties.content_type {
        json.insert("content_type".into(), content_type.as_str().into());
    }
    if let Some(format) = properties.payload_format_indicator {
        json.insert("payload_format".into(), format.into());
    }
    if let Some(expiry) = properties.message_expiry_interval {
        json.insert("message_expiry".into(), expiry.into());
    }
    if let Some(alias) = properties.topic_alias {
        json.insert("topic_alias".into(), alias.into());
    }
    if !properties.subscription_identifiers.is_empty() {
        json.insert("subscription_ids".into(), properties.subscription_identifiers.clone().into());
    }
    json
}

/// `[[key, value], ...]`, order and repeats kept.
fn user_properties(value: &Value) -> Result<Vec<(String, String)>, String> {
    let pairs = value.as_array().ok_or("not a list of [key, value] pairs")?;
    let pair = |pair: &Value| match pair.as_array().map(Vec::as_slice) {
        Some([Value::String(key), Value::String(value)]) => Ok((key.clone(), value.clone())),
        _ => Err(format!("{pair} is not a [key, value] pair of strings")),
    };
    pairs.iter().map(pair).collect()
}

fn text(value: &Value) -> Result<&str, String> {
    value.as_str().ok_or_else(|| format!("{value} is not a string"))
}

fn from_hex(hex: &str) -> Result<Vec<u8>, String> {
    if !hex.len().is_multiple_of(2) || !hex.bytes().all(|digit| digit.is_ascii_hexdigit()) {
        return Err(format!("{hex:?} is not hex"));
    }
    // ASCII digits only: every pair is a whole &str.
    let byte = |at: usize| u8::from_str_radix(&hex[at..at + 2], 16).expect("two hex digits");
    Ok((0..hex.len()).step_by(2).map(byte).collect())
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
