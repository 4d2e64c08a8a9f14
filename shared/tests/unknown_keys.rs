//! Every struct and every struct-like enum variant of the configuration refuses an
//! unknown key, at the key's FILE:LINE:COL.
//!
//! The walk is kept complete by the code, not by memory:
//! - every type of `shared/src/config/*.rs` that derives `Deserialize` is read from the
//!   source, and each struct must have a case below and each enum must be probed;
//! - each probed enum's variants come from its `Deserialize` impl (serde hands them to
//!   `deserialize_enum`), and each struct-like variant must have a case.
//!
//! A case is a configuration that is valid as it stands and holds `TYPO` where a
//! misspelt key is then written: without it the file must load, with it the error
//! must point at the misspelt key.

use forkd_shared::config::{self, limits, overload, raw, tls, Config};
use serde::de::{self, Deserialize, DeserializeSeed, IntoDeserializer, Visitor};
use std::cell::Cell;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// A configuration with every kind of block in it; each placeholder is replaced by a
/// case's text or by its default.
const BASE: &str = r#"(
    TOP
    upstreams: {
        "app": (servers: [ADDR], UPSTREAM),
    },
    servers: [(
        listen: [LISTEN],
        SERVERKEYS
        routes: [
            (prefix: "/", handler: HANDLER, ROUTE),
            (prefix: "/api/", handler: Proxy(upstream: "app")),
        ],
    )],
)"#;

const DEFAULTS: &[(&str, &str)] = &[
    (
        "TOP",
        r#"caches: { "c": (path: "cache", max_size: "1MiB") },"#,
    ),
    ("ADDR", r#""127.0.0.1:9000""#),
    ("UPSTREAM", ""),
    ("LISTEN", r#""127.0.0.1:8080""#),
    ("SERVERKEYS", ""),
    ("HANDLER", r#"Static(root: "www")"#),
    ("ROUTE", ""),
];

struct Case {
    /// The structs (by name) and enum variants (`Enum::Variant`) whose keys it tests.
    covers: &'static [&'static str],
    /// The placeholder of [`BASE`] it fills, with text holding `TYPO`.
    at: &'static str,
    text: &'static str,
    /// The misspelt key written at `TYPO`.
    typo: &'static str,
}

const CASES: &[Case] = &[
    Case {
        covers: &["RawConfig"],
        at: "TOP",
        text: "TYPO",
        typo: "wokers",
    },
    Case {
        covers: &["RawServer"],
        at: "SERVERKEYS",
        text: "TYPO",
        typo: "keepalive_timout",
    },
    Case {
        covers: &["ListenFields"],
        at: "LISTEN",
        text: r#"(addr: "127.0.0.1:8080", TYPO)"#,
        typo: "proxy_protocl",
    },
    Case {
        covers: &["RawRoute"],
        at: "ROUTE",
        text: "TYPO",
        typo: "prority",
    },
    Case {
        covers: &["RawHandler::Static"],
        at: "HANDLER",
        text: r#"Static(root: "www", TYPO)"#,
        typo: "indx",
    },
    Case {
        covers: &["RawCompress"],
        at: "HANDLER",
        text: r#"Static(root: "www", compress: Some((TYPO)))"#,
        typo: "levl",
    },
    Case {
        covers: &["RawHandler::Redirect"],
        at: "HANDLER",
        text: r#"Redirect(to: "/new/{path}", TYPO)"#,
        typo: "stauts",
    },
    Case {
        covers: &["RawHandler::Return"],
        at: "HANDLER",
        text: "Return(status: 200, TYPO)",
        typo: "bdoy",
    },
    Case {
        covers: &["RawHandler::Proxy"],
        at: "HANDLER",
        text: r#"Proxy(upstream: "app", TYPO)"#,
        typo: "bufering",
    },
    Case {
        covers: &["RawCacheZone"],
        at: "TOP",
        text: r#"caches: { "c": (path: "cache", max_size: "1MiB", TYPO) },"#,
        typo: "max_sise",
    },
    Case {
        covers: &["RawRouteCache"],
        at: "HANDLER",
        text: r#"Proxy(upstream: "app", cache: Some((zone: "c", TYPO)))"#,
        typo: "stale_if_eror",
    },
    Case {
        covers: &["RawHandler::Purge"],
        at: "HANDLER",
        text: r#"Purge(zone: "c", TYPO)"#,
        typo: "kye",
    },
    Case {
        covers: &["Limits"],
        at: "SERVERKEYS",
        text: "limits: Some((TYPO)),",
        typo: "conn_per_pi",
    },
    Case {
        covers: &["RateLimit", "RateFields"],
        at: "ROUTE",
        text: r#"limits: Some((rates: [(key: ClientIp, rate: "1/s", burst: 1, TYPO)])),"#,
        typo: "ipv6_prefx",
    },
    Case {
        covers: &["RawTls"],
        at: "SERVERKEYS",
        text: r#"tls: Some((certificates: [(cert: "cert.pem", key: "key.pem")], TYPO)),"#,
        typo: "session_tickts",
    },
    Case {
        covers: &["RawCertificate"],
        at: "SERVERKEYS",
        text: r#"tls: Some((certificates: [(cert: "cert.pem", key: "key.pem", TYPO)])),"#,
        typo: "chain",
    },
    Case {
        covers: &["RawUpstream"],
        at: "UPSTREAM",
        text: "TYPO",
        typo: "keep_alive",
    },
    Case {
        covers: &["ServerFields"],
        at: "ADDR",
        text: r#"(addr: "127.0.0.1:9000", TYPO)"#,
        typo: "wieght",
    },
    Case {
        covers: &["RawHealthCheck"],
        at: "UPSTREAM",
        text: r#"health_check: Some((path: "/healthz", TYPO)),"#,
        typo: "intervall",
    },
    Case {
        covers: &["Overload"],
        at: "UPSTREAM",
        text: "overload: Some((TYPO)),",
        typo: "max_limt",
    },
];

/// Every enum of the configuration, probed for its variants: a new enum that derives
/// `Deserialize` must be added here (see `every_deserialized_type_is_walked`).
fn enums() -> Vec<(&'static str, Vec<(&'static str, Shape)>)> {
    vec![
        ("RawHandler", variants::<raw::RawHandler>()),
        ("Balance", variants::<raw::Balance>()),
        ("HashKey", variants::<raw::HashKey>()),
        ("Workers", variants::<raw::Workers>()),
        ("CpuAffinity", variants::<raw::CpuAffinity>()),
        ("AcceptMode", variants::<raw::AcceptMode>()),
        ("RawLogTarget", variants::<raw::RawLogTarget>()),
        ("LogLevel", variants::<raw::LogLevel>()),
        ("AccessLogFormat", variants::<config::AccessLogFormat>()),
        ("LimitMode", variants::<limits::LimitMode>()),
        ("LimitKey", variants::<limits::LimitKey>()),
        ("OverloadMode", variants::<overload::OverloadMode>()),
        ("Priority", variants::<overload::Priority>()),
        ("TlsVersion", variants::<tls::TlsVersion>()),
        ("RawHost", variants::<config::shaping::RawHost>()),
        ("Http2Listen", variants::<raw::Http2Listen>()),
    ]
}

#[test]
fn every_struct_and_enum_variant_refuses_a_misspelt_key_where_it_is() {
    let dir = Site::new();
    for case in CASES {
        let with = |typo: &str| {
            let mut text = BASE.replace(case.at, &case.text.replace("TYPO", typo));
            for (at, default) in DEFAULTS {
                text = text.replace(at, default);
            }
            text
        };
        let valid = with("");
        if let Err(e) = Config::parse(&dir.config, &valid) {
            panic!(
                "{:?} without the typo should load:\n{valid}\n{e}",
                case.covers
            );
        }
        let text = with(&format!("{}: 1,", case.typo));
        let err = match Config::parse(&dir.config, &text) {
            Ok(_) => panic!("{:?}: `{}` was accepted:\n{text}", case.covers, case.typo),
            Err(e) => e.to_string(),
        };
        let (line, col) = position(&text, case.typo);
        let want = format!("{}:{line}:{col}: ", dir.config.display());
        assert!(
            err.starts_with(&want) && err.contains(&format!("`{}`", case.typo)),
            "{:?}: want {want}... naming `{}`, got\n{err}\nin\n{text}",
            case.covers,
            case.typo
        );
    }
}

#[test]
fn every_deserialized_type_is_walked() {
    let (structs, enum_names) = deserialized_types();
    let covered: BTreeSet<&str> = CASES
        .iter()
        .flat_map(|c| c.covers.iter().copied())
        .collect();
    for name in &structs {
        assert!(
            covered.contains(name.as_str()),
            "struct {name} derives Deserialize but no case of CASES misspells a key in it"
        );
    }
    let probed = enums();
    let probed_names: BTreeSet<String> = probed.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(
        probed_names, enum_names,
        "enums() must probe exactly the enums that derive Deserialize"
    );
    let mut struct_variants = BTreeSet::new();
    for (name, variants) in &probed {
        assert!(!variants.is_empty(), "{name} has no variants");
        for (variant, shape) in variants {
            if *shape == Shape::Struct {
                let path = format!("{name}::{variant}");
                assert!(
                    covered.contains(path.as_str()),
                    "{path} is a struct variant and no case of CASES misspells a key in it"
                );
                struct_variants.insert(path);
            }
        }
    }
    // The probe itself sees what it should.
    for v in ["Static", "Redirect", "Return", "Proxy"] {
        assert!(struct_variants.contains(&format!("RawHandler::{v}")));
    }
    // No case is about something that no longer exists.
    for name in covered {
        assert!(
            structs.contains(name) || struct_variants.contains(name),
            "CASES covers {name}, which is no Deserialize struct or struct variant"
        );
    }
}

/// 1-based line and column (in characters) of the only occurrence of `word` in `text`.
fn position(text: &str, word: &str) -> (usize, usize) {
    assert_eq!(text.matches(word).count(), 1, "`{word}` must occur once");
    let offset = text.find(word).unwrap();
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let col = before[before.rfind('\n').map_or(0, |nl| nl + 1)..]
        .chars()
        .count()
        + 1;
    (line, col)
}

/// The structs and the enums of `shared/src/config/` that derive `Deserialize`, by
/// name, read from the source.
fn deserialized_types() -> (BTreeSet<String>, BTreeSet<String>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/config");
    let (mut structs, mut enums) = (BTreeSet::new(), BTreeSet::new());
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let source = std::fs::read_to_string(&path).unwrap();
        let mut derived = false;
        for line in source.lines().map(str::trim) {
            if line.starts_with("#[derive(") && line.contains("Deserialize") {
                derived = true;
                continue;
            }
            if !derived || line.starts_with("#[") || line.starts_with("//") {
                continue;
            }
            let item = line
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub(super) ")
                .trim_start_matches("pub ");
            let name = |rest: &str| {
                rest.split(|c: char| !c.is_alphanumeric() && c != '_')
                    .next()
                    .unwrap()
                    .to_string()
            };
            if let Some(rest) = item.strip_prefix("struct ") {
                structs.insert(name(rest));
            } else if let Some(rest) = item.strip_prefix("enum ") {
                enums.insert(name(rest));
            } else {
                panic!("{}: a derive(Deserialize) before `{line}`", path.display());
            }
            derived = false;
        }
    }
    assert!(structs.contains("RawConfig") && enums.contains("RawHandler"));
    (structs, enums)
}

/// A temporary folder with what the cases' files name: `www`, a certificate and key.
struct Site {
    root: PathBuf,
    config: PathBuf,
}

impl Site {
    fn new() -> Site {
        let root = std::env::temp_dir().join(format!("forkd-unknown-keys-{}", std::process::id()));
        std::fs::create_dir_all(root.join("www")).unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        std::fs::write(root.join("cert.pem"), cert.cert.pem()).unwrap();
        std::fs::write(root.join("key.pem"), cert.key_pair.serialize_pem()).unwrap();
        Site {
            config: root.join("forkd.ron"),
            root,
        }
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

// -- the probe: a deserializer that only answers `deserialize_enum` --

/// What a variant holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Unit,
    Newtype,
    Tuple,
    Struct,
}

/// Every variant of `T` with its shape, as `T`'s `Deserialize` describes them.
fn variants<T: for<'de> Deserialize<'de>>() -> Vec<(&'static str, Shape)> {
    let names = Cell::new(None);
    let _ = T::deserialize(Probe {
        variant: None,
        names: &names,
        shape: &Cell::new(None),
    });
    let names: &'static [&'static str] = names.get().expect("not an enum");
    (0..names.len())
        .map(|i| {
            let shape = Cell::new(None);
            let _ = T::deserialize(Probe {
                variant: Some(i),
                names: &Cell::new(None),
                shape: &shape,
            });
            (names[i], shape.get().expect("variant not reached"))
        })
        .collect()
}

#[derive(Debug)]
struct Stop;

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("probe stops here")
    }
}
impl std::error::Error for Stop {}
impl de::Error for Stop {
    fn custom<M: std::fmt::Display>(_: M) -> Stop {
        Stop
    }
}

/// Records the variant names, or, given `variant`, walks into that variant and
/// records its shape.
struct Probe<'a> {
    variant: Option<usize>,
    names: &'a Cell<Option<&'static [&'static str]>>,
    shape: &'a Cell<Option<Shape>>,
}

impl<'de> de::Deserializer<'de> for Probe<'_> {
    type Error = Stop;
    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
        Err(Stop)
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Stop> {
        self.names.set(Some(variants));
        match self.variant {
            None => Err(Stop),
            Some(i) => visitor.visit_enum(Chosen {
                name: variants[i],
                shape: self.shape,
            }),
        }
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map
        struct identifier ignored_any
    }
}

struct Chosen<'a> {
    name: &'static str,
    shape: &'a Cell<Option<Shape>>,
}

impl<'de, 'a> de::EnumAccess<'de> for Chosen<'a> {
    type Error = Stop;
    type Variant = Chosen<'a>;
    fn variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<(S::Value, Self), Stop> {
        let tag = seed.deserialize(IntoDeserializer::<Stop>::into_deserializer(self.name))?;
        Ok((tag, self))
    }
}

impl<'de> de::VariantAccess<'de> for Chosen<'_> {
    type Error = Stop;
    fn unit_variant(self) -> Result<(), Stop> {
        self.shape.set(Some(Shape::Unit));
        Ok(())
    }
    fn newtype_variant_seed<S: DeserializeSeed<'de>>(self, _: S) -> Result<S::Value, Stop> {
        self.shape.set(Some(Shape::Newtype));
        Err(Stop)
    }
    fn tuple_variant<V: Visitor<'de>>(self, _: usize, _: V) -> Result<V::Value, Stop> {
        self.shape.set(Some(Shape::Tuple));
        Err(Stop)
    }
    fn struct_variant<V: Visitor<'de>>(
        self,
        _: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Stop> {
        self.shape.set(Some(Shape::Struct));
        Err(Stop)
    }
}
