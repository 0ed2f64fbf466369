//! How a contract type a store or a custom resource holds is serialized:
//! as its text, a plain string, read back only through its parser (a
//! record that does not parse is refused, never carried on), and described
//! by `String`'s JSON schema, inlined, so a resource's schema is the same
//! as for the `String` field it replaced. Behind the `serde` feature.

/// Implements `Serialize`, `Deserialize` (through `$parse`) and
/// `JsonSchema` for `$ty`, whose `as_str()` is its text.
macro_rules! stored_as_text {
    ($ty:ty, $parse:path) => {
        #[cfg(feature = "serde")]
        const _: () = {
            use std::borrow::Cow;

            impl serde::Serialize for $ty {
                fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                    s.serialize_str(self.as_str())
                }
            }

            impl<'de> serde::Deserialize<'de> for $ty {
                fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                    let text = Cow::<'de, str>::deserialize(d)?;
                    $parse(&text).map_err(serde::de::Error::custom)
                }
            }

            impl schemars::JsonSchema for $ty {
                fn schema_name() -> Cow<'static, str> {
                    // Inlined as a plain string, as a `String` field was.
                    String::schema_name()
                }

                fn inline_schema() -> bool {
                    true
                }

                fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
                    String::json_schema(generator)
                }
            }
        };
    };
}

pub(crate) use stored_as_text;
