//! [`Shared`]: a value that crosses the ABI many times unchanged, encoded once and parsed
//! once per plugin.

use std::any::{Any, TypeId};
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex, OnceLock};

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use crate::service::{raw_text_works, RawText};

/// A read-only value that is passed on across the ABI as it came: its JSON is kept beside
/// it, so sending it again writes that JSON as it is, and receiving JSON this plugin has
/// seen recently gives the value parsed then instead of parsing it again.
///
/// For a large value that one call hands from plugin to plugin unchanged, such as the
/// sandbox policy a tool resolves and passes to the `fs` and shell backends. On the wire it
/// is exactly `T`'s JSON, so an interface may change a field or result from `T` to
/// `Shared<T>` without changing its version. It derefs to `T`; [`Shared::into_inner`]
/// gives an owned `T` to change.
///
/// A received value is looked up by its exact JSON text among the last few received for
/// `T` in this plugin ([`Shared::CACHED`]), and parsed only when none matches. Parsing is
/// deterministic, so a value found this way is the one parsing would give. JSON over
/// [`Shared::MAX_CACHED_BYTES`], or over several lines, is parsed every time and not kept.
pub struct Shared<T>(Arc<Inner<T>>);

struct Inner<T> {
    value: T,
    /// The JSON text of `value`: as received, or as encoded the first time it is sent.
    json: OnceLock<Box<str>>,
}

impl<T> Shared<T> {
    /// How many received values of one type each plugin keeps.
    pub const CACHED: usize = 8;
    /// The longest JSON text of a received value that is kept.
    pub const MAX_CACHED_BYTES: usize = 256 * 1024;

    /// Wraps `value`; its JSON is encoded when it is first sent.
    pub fn new(value: T) -> Shared<T> {
        Shared(Arc::new(Inner {
            value,
            json: OnceLock::new(),
        }))
    }

    /// Whether `a` and `b` are handles of one value: clones of one [`Shared::new`], or the
    /// same JSON received twice and found in this plugin's cache. A plugin may keep what it
    /// derived from a value and reuse it while the same value comes again.
    pub fn ptr_eq(a: &Shared<T>, b: &Shared<T>) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }

    /// The value, owned: moved out when this is its only handle, else cloned.
    pub fn into_inner(self) -> T
    where
        T: Clone,
    {
        match Arc::try_unwrap(self.0) {
            Ok(inner) => inner.value,
            Err(shared) => shared.value.clone(),
        }
    }
}

impl<T: Serialize> Shared<T> {
    /// The JSON text of the value: as received, or encoded now (once).
    fn json(&self) -> Result<&str, serde_json::Error> {
        if let Some(json) = self.0.json.get() {
            return Ok(json);
        }
        let encoded = serde_json::to_string(&self.0.value)?.into_boxed_str();
        Ok(self.0.json.get_or_init(|| encoded))
    }
}

impl<T> Deref for Shared<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0.value
    }
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<T> From<T> for Shared<T> {
    fn from(value: T) -> Self {
        Shared::new(value)
    }
}

impl<T: fmt::Debug> fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.value.fmt(f)
    }
}

impl<T: PartialEq> PartialEq for Shared<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0.value == other.0.value
    }
}

impl<T: Eq> Eq for Shared<T> {}

impl<T: Serialize> Serialize for Shared<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if !std::any::type_name::<S>().contains("serde_json::") || !raw_text_works() {
            return self.0.value.serialize(serializer);
        }
        match self.json() {
            Ok(json) => RawText(json).serialize(serializer),
            Err(_) => self.0.value.serialize(serializer),
        }
    }
}

impl<'de, T> Deserialize<'de> for Shared<T>
where
    T: DeserializeOwned + Serialize + Send + Sync + 'static,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Only `serde_json`'s own parser hands over the text of a value.
        if !std::any::type_name::<D>().contains("serde_json::de::Deserializer") {
            return T::deserialize(deserializer).map(Shared::new);
        }
        // Text read from memory is borrowed (copied only when it is kept); from a reader
        // it is taken whole.
        let name = std::any::type_name::<D>();
        let boxed;
        let json = if name.contains("StrRead") || name.contains("SliceRead") {
            <&'de RawValue>::deserialize(deserializer)?.get()
        } else {
            boxed = Box::<RawValue>::deserialize(deserializer)?;
            boxed.get()
        };
        // Text over several lines is sent again as encoded here, never as received: a line
        // of a line-delimited stream stays one line.
        if json.len() > Self::MAX_CACHED_BYTES
            || memchr::memchr2(b'\n', b'\r', json.as_bytes()).is_some()
        {
            return serde_json::from_str(json)
                .map(Shared::new)
                .map_err(D::Error::custom);
        }
        let cache = cache::<T>();
        if let Some(found) = lock(cache).find(json) {
            return Ok(found);
        }
        let value: T = serde_json::from_str(json).map_err(D::Error::custom)?;
        let shared = Shared(Arc::new(Inner {
            value,
            json: OnceLock::from(Box::<str>::from(json)),
        }));
        lock(cache).keep(shared.clone());
        Ok(shared)
    }
}

impl<T: schemars::JsonSchema> schemars::JsonSchema for Shared<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        T::schema_name()
    }

    fn schema_id() -> std::borrow::Cow<'static, str> {
        T::schema_id()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        T::json_schema(generator)
    }
}

/// The values of one type received last, newest first.
struct Recent<T>(Vec<Shared<T>>);

impl<T: Serialize> Recent<T> {
    fn find(&mut self, json: &str) -> Option<Shared<T>> {
        let at = self
            .0
            .iter()
            .position(|s| s.0.json.get().is_some_and(|j| **j == *json))?;
        self.0[..=at].rotate_right(1);
        Some(self.0[0].clone())
    }

    fn keep(&mut self, shared: Shared<T>) {
        self.0.truncate(Shared::<T>::CACHED - 1);
        self.0.insert(0, shared);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The cache of received values of type `T` in this plugin (each plugin links its own copy
/// of the SDK, so each has its own).
fn cache<T: Send + Sync + 'static>() -> &'static Mutex<Recent<T>> {
    // A few types at most: a list is searched faster than a map is hashed.
    type Caches = Vec<(TypeId, &'static (dyn Any + Send + Sync))>;
    static CACHES: Mutex<Caches> = Mutex::new(Vec::new());
    let mut caches = lock(&CACHES);
    let any = match caches.iter().find(|(id, _)| *id == TypeId::of::<T>()) {
        Some((_, any)) => *any,
        None => {
            let any: &'static (dyn Any + Send + Sync) =
                Box::leak(Box::new(Mutex::new(Recent::<T>(Vec::new()))));
            caches.push((TypeId::of::<T>(), any));
            any
        }
    };
    any.downcast_ref::<Mutex<Recent<T>>>()
        .expect("the cache of a type holds that type's values")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
    struct Policy {
        mode: String,
        paths: Vec<String>,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Args {
        path: String,
        policy: Option<Shared<Policy>>,
    }

    fn policy(mode: &str) -> Policy {
        Policy {
            mode: mode.into(),
            paths: vec!["/a \"quoted\"\n".into(), "/b/é".into()],
        }
    }

    #[test]
    fn on_the_wire_it_is_the_json_of_its_value() {
        let args = Args {
            path: "x".into(),
            policy: Some(policy("read-only").into()),
        };
        let plain = serde_json::json!({ "path": "x", "policy": policy("read-only") });
        let sent = serde_json::to_string(&args).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&sent).unwrap(),
            plain
        );
        assert_eq!(serde_json::to_value(&args).unwrap(), plain);
        // Sent again after being received: the same text.
        let back: Args = serde_json::from_str(&sent).unwrap();
        assert_eq!(back, args);
        assert_eq!(serde_json::to_string(&back).unwrap(), sent);
        // Through a deserializer that is not `serde_json`'s parser.
        let from_value: Args = serde_json::from_value(plain).unwrap();
        assert_eq!(from_value, args);
        // From bytes (the text borrowed) and from a reader (the text taken whole): the
        // same value, the same text, the same kept value.
        let from_slice: Args = serde_json::from_slice(sent.as_bytes()).unwrap();
        let from_reader: Args = serde_json::from_reader(sent.as_bytes()).unwrap();
        for got in [&from_slice, &from_reader] {
            assert_eq!(*got, args);
            assert_eq!(serde_json::to_string(got).unwrap(), sent);
        }
        let kept = |a: &Args| a.policy.clone().unwrap().0;
        assert!(Arc::ptr_eq(&kept(&from_slice), &kept(&back)));
        assert!(Arc::ptr_eq(&kept(&from_reader), &kept(&back)));
    }

    #[test]
    fn the_same_text_gives_the_value_parsed_before_and_other_text_is_parsed() {
        let text = |mode: &str| {
            format!(
                r#"{{"path":"x","policy":{}}}"#,
                serde_json::to_string(&policy(mode)).unwrap()
            )
        };
        let first: Args = serde_json::from_str(&text("cached-1")).unwrap();
        let again: Args = serde_json::from_str(&text("cached-1")).unwrap();
        let (first, again) = (first.policy.unwrap(), again.policy.unwrap());
        assert!(Arc::ptr_eq(&first.0, &again.0), "parsed again");
        // One byte different (white space included) is another value, parsed.
        let spaced = text("cached-1").replace(":[", ": [");
        let other: Args = serde_json::from_str(&spaced).unwrap();
        let other = other.policy.unwrap();
        assert!(!Arc::ptr_eq(&first.0, &other.0));
        assert_eq!(*other, policy("cached-1"));
        let changed: Args = serde_json::from_str(&text("cached-2")).unwrap();
        assert_eq!(*changed.policy.unwrap(), policy("cached-2"));
        // A bad value is an error, and is not kept.
        let bad = r#"{"path":"x","policy":{"mode":1,"paths":[]}}"#;
        assert!(serde_json::from_str::<Args>(bad).is_err());
        assert!(serde_json::from_str::<Args>(bad).is_err());
    }

    #[test]
    fn the_cache_keeps_the_last_few_and_no_oversized_text() {
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        struct Own(String);
        let parse = |s: &str| -> Shared<Own> {
            serde_json::from_str(&serde_json::to_string(s).unwrap()).unwrap()
        };
        let first = parse("0");
        for i in 1..Shared::<Own>::CACHED {
            parse(&i.to_string());
        }
        assert!(Arc::ptr_eq(&first.0, &parse("0").0), "within the last few");
        for i in 100..100 + Shared::<Own>::CACHED {
            parse(&i.to_string());
        }
        assert!(!Arc::ptr_eq(&first.0, &parse("0").0), "pushed out");
        assert!(lock(cache::<Own>()).0.len() <= Shared::<Own>::CACHED);
        let big = "x".repeat(Shared::<Own>::MAX_CACHED_BYTES);
        let (a, b) = (parse(&big), parse(&big));
        assert_eq!(a, b);
        assert!(!Arc::ptr_eq(&a.0, &b.0), "an oversized text is not kept");
        // Text over lines is neither kept nor sent again as it came.
        let lines = "{\n\"mode\": \"m\",\r\n\"paths\": []}";
        let (a, b): (Shared<Policy>, Shared<Policy>) = (
            serde_json::from_str(lines).unwrap(),
            serde_json::from_str(lines).unwrap(),
        );
        assert!(!Arc::ptr_eq(&a.0, &b.0), "a text over lines is not kept");
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#"{"mode":"m","paths":[]}"#
        );
    }

    #[test]
    fn into_inner_moves_or_clones() {
        let one = Shared::new(policy("a"));
        let two = one.clone();
        assert_eq!(one.into_inner(), policy("a"));
        assert_eq!(two.into_inner(), policy("a"));
    }
}
