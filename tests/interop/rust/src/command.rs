//! A command's fields, read into the driver's own types; a missing or bad field is an error that
//! names it (README: "The driver protocol").

use serde_json::{Map, Value};

/// The protocol's default timeout of a command, in milliseconds.
const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// The largest Subscription Identifier MQTT 5.0 allows (a variable byte integer).
const MAX_SUBSCRIPTION_ID: usize = 268_435_455;

pub struct Command<'a> {
    fields: &'a Map<String, Value>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V4,
    V5,
}

pub struct ConnectParams {
    pub host: String,
    pub port: u16,
    pub client_id: String,
    pub version: Version,
    pub clean: bool,
    pub keepalive: u16,
    pub reconnect: bool,
    /// 0: no Session Expiry Interval in CONNECT.
    pub session_expiry: u32,
    /// 0: no Topic Alias Maximum in CONNECT.
    pub topic_alias_maximum: u16,
    pub username: Option<String>,
    pub password: Option<String>,
}

pub struct SubscribeParams {
    pub filter: String,
    pub qos: u8,
    pub subscription_id: Option<usize>,
}

pub struct PublishParams {
    pub topic: String,
    pub payload: String,
    pub qos: u8,
    pub retain: bool,
    /// The 5.0 properties as sent, read by the v5 client (`properties::publish_properties`).
    pub properties: Map<String, Value>,
}

impl<'a> Command<'a> {
    pub fn new(fields: &'a Map<String, Value>) -> Self {
        Command { fields }
    }

    pub fn timeout(&self) -> Result<std::time::Duration, String> {
        let ms = self.uint_or("timeout_ms", DEFAULT_TIMEOUT_MS, u64::from(u32::MAX))?;
        Ok(std::time::Duration::from_millis(ms))
    }

    pub fn connect(&self) -> Result<ConnectParams, String> {
        let (host, port) = parse_url(&self.string("url")?)?;
        let version = match self.uint_or("version", 4, u8::MAX)? {
            4 => Version::V4,
            5 => Version::V5,
            other => return Err(format!("field 'version': {other} is neither 4 nor 5")),
        };
        Ok(ConnectParams {
            host,
            port,
            client_id: self.string("client_id")?,
            version,
            clean: self.bool_or("clean", true)?,
            keepalive: self.uint_or("keepalive", 30, u16::MAX)?,
            reconnect: self.bool_or("reconnect", false)?,
            session_expiry: self.uint_or("session_expiry", 0, u32::MAX)?,
            topic_alias_maximum: self.uint_or("topic_alias_maximum", 0, u16::MAX)?,
            username: self.optional_string("username")?,
            password: self.optional_string("password")?,
        })
    }

    pub fn subscribe(&self) -> Result<SubscribeParams, String> {
        let subscription_id = match self.optional_uint("subscription_id", MAX_SUBSCRIPTION_ID)? {
            Some(0) => return Err("field 'subscription_id': must be at least 1".into()),
            id => id,
        };
        Ok(SubscribeParams { filter: self.string("filter")?, qos: self.qos()?, subscription_id })
    }

    pub fn filter(&self) -> Result<String, String> {
        self.string("filter")
    }

    pub fn publish(&self) -> Result<PublishParams, String> {
        let properties = match self.fields.get("properties") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(properties)) => properties.clone(),
            Some(_) => return Err("field 'properties': not an object".into()),
        };
        Ok(PublishParams {
            topic: self.string("topic")?,
            payload: self.optional_string("payload")?.unwrap_or_default(),
            qos: self.qos()?,
            retain: self.bool_or("retain", false)?,
            properties,
        })
    }

    fn qos(&self) -> Result<u8, String> {
        self.uint_or("qos", 0, 2)
    }

    fn string(&self, name: &str) -> Result<String, String> {
        self.optional_string(name)?.ok_or_else(|| format!("field '{name}' is missing"))
    }

    fn optional_string(&self, name: &str) -> Result<Option<String>, String> {
        match self.fields.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(_) => Err(format!("field '{name}': not a string")),
        }
    }

    fn bool_or(&self, name: &str, default: bool) -> Result<bool, String> {
        match self.fields.get(name) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(flag)) => Ok(*flag),
            Some(_) => Err(format!("field '{name}': not a boolean")),
        }
    }

    fn uint_or<T: Uint>(&self, name: &str, default: T, max: T) -> Result<T, String> {
        Ok(self.optional_uint(name, max)?.unwrap_or(default))
    }

    fn optional_uint<T: Uint>(&self, name: &str, max: T) -> Result<Option<T>, String> {
        match self.fields.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => uint(value, max).map(Some).map_err(|err| format!("field '{name}': {err}")),
        }
    }
}

/// The unsigned integer types of the fields.
pub trait Uint: TryFrom<u64> + PartialOrd + std::fmt::Display {}
impl<T: TryFrom<u64> + PartialOrd + std::fmt::Display> Uint for T {}

/// An integer of 0 to `max`, or why not.
pub fn uint<T: Uint>(value: &Value, max: T) -> Result<T, String> {
    let n = value.as_u64().ok_or_else(|| format!("{value} is not a non-negative integer"))?;
    match T::try_from(n) {
        Ok(n) if n <= max => Ok(n),
        _ => Err(format!("{value} is above {max}")),
    }
}

/// `mqtt://HOST:PORT` (also `tcp://`) into host and port. This driver speaks TCP only: rumqttc's
/// WebSocket transport is a feature left out of the build, and the README has MQTT.js cover WebSocket.
fn parse_url(url: &str) -> Result<(String, u16), String> {
    let address = url
        .strip_prefix("mqtt://")
        .or_else(|| url.strip_prefix("tcp://"))
        .ok_or_else(|| format!("field 'url': {url:?} is not mqtt://HOST:PORT (this driver speaks TCP only)"))?;
    let address = address.trim_end_matches('/');
    // The last colon: an IPv6 host keeps its brackets, which tokio's address lookup understands.
    let (host, port) = address.rsplit_once(':').ok_or_else(|| format!("field 'url': {url:?} has no port"))?;
    let port = port.parse().map_err(|_| format!("field 'url': bad port {port:?}"))?;
    Ok((host.to_string(), port))
}
