//! Every environment variable rivet reads, in one table (name, default, meaning), parsed once per
//! process. README.md carries the same table; a test keeps the two in step. An invalid value gets a
//! WARN naming the variable and what it accepts, and the default is used.

use std::sync::OnceLock;

pub struct Var {
    pub name: &'static str,
    pub default: &'static str,
    pub meaning: &'static str,
}

/// The table. `rivet config` prints it with the values in effect.
pub const VARS: &[Var] = &[
    Var {
        name: "NCCL_DEBUG",
        default: "WARN",
        meaning: "Log level: VERSION, WARN, INFO or TRACE. Inside NCCL, NCCL's own logger applies it too; outside NCCL (CLI, tests) lines go to stderr.",
    },
    Var {
        name: "NCCL_SOCKET_IFNAME",
        default: "all but lo, docker*",
        meaning: "Interfaces the TCP transport uses: comma-separated prefixes; `^` excludes the listed ones; `=` matches exact names. Without it, lo and docker* are used only when nothing else exists.",
    },
    Var {
        name: "NCCL_SOCKET_FAMILY",
        default: "any",
        meaning: "Address family of the TCP transport's interfaces: AF_INET or AF_INET6.",
    },
    Var {
        name: "RIVET_SOCKET_NSTREAMS",
        default: "2",
        meaning: "TCP streams per connection (1-16); messages of at least 2 x RIVET_SOCKET_MIN_CHUNK are split across them.",
    },
    Var {
        name: "RIVET_SOCKET_MIN_CHUNK",
        default: "131072",
        meaning: "Smallest piece (bytes, 4096-1073741824) of a message sent on one TCP stream.",
    },
    Var {
        name: "RIVET_TIMEOUT",
        default: "30",
        meaning: "Seconds (1-3600) before a connection setup, an unanswered handshake or unacknowledged data on a TCP stream fails with an error instead of waiting forever.",
    },
];

#[derive(Debug, Clone)]
pub struct Config {
    pub socket_ifname: Option<String>,
    pub socket_family: Option<i32>,
    pub socket_nstreams: usize,
    pub socket_min_chunk: usize,
    pub timeout_secs: u64,
}

fn default_of(name: &str) -> &'static str {
    VARS.iter().find(|v| v.name == name).map(|v| v.default).unwrap_or("")
}

type Getter<'a> = &'a dyn Fn(&str) -> Option<String>;

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.trim().is_empty())
}

/// Parse an integer variable in `[min, max]`; WARN and use the default otherwise.
fn int_var(get: Getter, name: &str, min: u64, max: u64) -> u64 {
    let def: u64 = default_of(name).parse().expect("numeric default");
    match get(name) {
        None => def,
        Some(s) => match s.trim().parse::<u64>() {
            Ok(v) if (min..=max).contains(&v) => v,
            _ => {
                log::warn!(
                    "NET/rivet: {name}={s} is invalid: it accepts an integer from {min} to {max}; using the default {def}"
                );
                def
            }
        },
    }
}

fn family_var(get: Getter) -> Option<i32> {
    let s = get("NCCL_SOCKET_FAMILY")?;
    match s.trim().to_ascii_uppercase().as_str() {
        "AF_INET" => Some(libc::AF_INET),
        "AF_INET6" => Some(libc::AF_INET6),
        _ => {
            log::warn!("NET/rivet: NCCL_SOCKET_FAMILY={s} is invalid: it accepts AF_INET or AF_INET6; using any family");
            None
        }
    }
}

impl Config {
    pub fn from_env() -> Config {
        Self::from_env_with(&env)
    }

    /// Parse from any source of variables (the environment, or a map in tests).
    pub fn from_env_with(get: Getter) -> Config {
        Config {
            socket_ifname: get("NCCL_SOCKET_IFNAME"),
            socket_family: family_var(get),
            socket_nstreams: int_var(get, "RIVET_SOCKET_NSTREAMS", 1, 16) as usize,
            socket_min_chunk: int_var(get, "RIVET_SOCKET_MIN_CHUNK", 4096, 1 << 30) as usize,
            timeout_secs: int_var(get, "RIVET_TIMEOUT", 1, 3600),
        }
    }

    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.timeout_secs)
    }
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// The process-wide configuration, read from the environment on first use.
pub fn get() -> &'static Config {
    CONFIG.get_or_init(Config::from_env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_parses() {
        for v in VARS {
            assert!(!v.default.is_empty() && !v.meaning.is_empty(), "{}", v.name);
        }
        // Numeric defaults must satisfy their own ranges.
        let c = Config::from_env_with(&|_| None);
        assert_eq!(c.socket_nstreams, 2);
        assert_eq!(c.timeout_secs, 30);
    }

    #[test]
    fn invalid_values_fall_back_to_defaults() {
        let get = |n: &str| match n {
            "RIVET_SOCKET_NSTREAMS" => Some("99".to_string()),
            "RIVET_TIMEOUT" => Some("soon".to_string()),
            "NCCL_SOCKET_FAMILY" => Some("AF_UNIX".to_string()),
            _ => None,
        };
        let c = Config::from_env_with(&get);
        assert_eq!(c.socket_nstreams, 2);
        assert_eq!(c.timeout_secs, 30);
        assert_eq!(c.socket_family, None);
        let ok = |n: &str| match n {
            "RIVET_SOCKET_NSTREAMS" => Some("8".to_string()),
            "NCCL_SOCKET_FAMILY" => Some("af_inet6".to_string()),
            _ => None,
        };
        let c = Config::from_env_with(&ok);
        assert_eq!(c.socket_nstreams, 8);
        assert_eq!(c.socket_family, Some(libc::AF_INET6));
    }

    #[test]
    fn readme_documents_every_variable_with_its_default() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
        for v in VARS {
            let row = readme
                .lines()
                .find(|l| l.starts_with(&format!("| `{}`", v.name)))
                .unwrap_or_else(|| panic!("README.md has no table row for {}", v.name));
            assert!(row.contains(&format!("`{}`", v.default)), "README row for {} lacks default {}", v.name, v.default);
        }
    }
}
