//! The rumqttc driver of tests/interop (README.md there): commands on stdin, results and events on
//! stdout, one JSON object a line. rumqttc's `v5` client speaks MQTT 5.0, its top-level one 3.1.1.

mod command;
mod output;
mod properties;
mod session;
mod tracker;
mod v4;
mod v5;

use command::{Command, ConnectParams, Version};
use serde_json::{Map, Value};
use session::Session;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tracker::Reply;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut driver = Driver::default();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) if line.trim().is_empty() => {}
            Ok(Some(line)) => driver.handle(&line).await,
            Ok(None) => break,
            Err(error) => {
                eprintln!("rumqttc driver: reading stdin: {error}");
                break;
            }
        }
    }
    // End of stdin ends the driver, like `exit` (without waiting for stdin's reader thread).
    std::process::exit(0);
}

#[derive(Default)]
struct Driver {
    session: Option<Session>,
}

impl Driver {
    /// One command line: its result is written once it is done.
    async fn handle(&mut self, line: &str) {
        let fields = match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(fields)) => fields,
            Ok(_) => return output::result(Value::Null, Err("a command is a JSON object".into())),
            Err(error) => return output::result(Value::Null, Err(format!("a command is JSON: {error}"))),
        };
        let id = match fields.get("id") {
            Some(id) if id.is_i64() || id.is_u64() => id.clone(),
            _ => return output::result(Value::Null, Err("field 'id': missing or not an integer".into())),
        };
        let op = fields.get("op").and_then(Value::as_str).unwrap_or_default();
        if op == "exit" {
            output::result(id, Ok(Map::new()));
            std::process::exit(0);
        }
        let outcome = self.run(op, &Command::new(&fields)).await;
        output::result(id, outcome);
    }

    async fn run(&mut self, op: &str, command: &Command<'_>) -> Reply {
        let timeout = command.timeout()?;
        match op {
            "connect" => self.connect(command.connect()?, timeout).await,
            "subscribe" => self.session()?.subscribe(&command.subscribe()?, timeout).await,
            "unsubscribe" => self.session()?.unsubscribe(&command.filter()?, timeout).await,
            "publish" => self.session()?.publish(&command.publish()?, timeout).await,
            "disconnect" => self.take_session()?.disconnect(timeout).await,
            "close" => {
                self.take_session()?.close().await;
                Ok(Map::new())
            }
            "" => Err("field 'op': missing or not a string".into()),
            other => Err(format!("unknown op '{other}'")),
        }
    }

    async fn connect(&mut self, params: ConnectParams, timeout: Duration) -> Reply {
        if self.session.as_ref().is_some_and(Session::is_alive) {
            return Err("already connected: disconnect or close first".into());
        }
        let connected = match params.version {
            Version::V4 => v4::connect(&params, timeout).await,
            Version::V5 => v5::connect(&params, timeout).await,
        };
        let (session, session_present) = connected?;
        self.session = Some(session);
        let mut fields = Map::new();
        fields.insert("session_present".into(), session_present.into());
        Ok(fields)
    }

    fn session(&self) -> Result<&Session, String> {
        self.session.as_ref().ok_or_else(|| "not connected".to_string())
    }

    fn take_session(&mut self) -> Result<Session, String> {
        self.session.take().ok_or_else(|| "not connected".to_string())
    }
}
