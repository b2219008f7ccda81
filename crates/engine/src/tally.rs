//! Typed tallies: an engine's own figures as a struct its tests and tools
//! read by field, from which `Stats::detail` (what `inspect` prints) is
//! generated, so a figure's name and its value cannot drift apart.
//!
//! An engine declares its snapshot once with [`tallies!`](crate::tallies):
//!
//! ```
//! pmhash_engine::tallies! {
//!     /// What a toy table did.
//!     pub struct Tallies {
//!         /// Splits made.
//!         splits: u64 => "splits",
//!         /// The highest load seen.
//!         max_load: pmhash_engine::Fixed<4> => "max load factor",
//!         /// The load at the first failed insert, if one failed.
//!         load_at_failure: Option<pmhash_engine::Fixed<4>> => "min load factor at failure",
//!     }
//! }
//! let t = Tallies { splits: 3, max_load: pmhash_engine::Fixed(0.5), load_at_failure: None };
//! assert_eq!(t.splits, 3);
//! assert_eq!(
//!     t.detail(),
//!     vec![
//!         ("splits".to_string(), "3".to_string()),
//!         ("max load factor".to_string(), "0.5000".to_string()),
//!         ("min load factor at failure".to_string(), "none".to_string()),
//!     ]
//! );
//! let back = Tallies::from_detail(&t.detail()).unwrap();
//! assert_eq!(back, t);
//! assert!(Tallies::from_detail(&[]).is_none(), "a missing figure");
//! ```
//!
//! Each field's type says how it prints ([`Figure`]): counts as integers,
//! [`Fixed`] to a number of decimal places, [`Pow2`] as `2^k`, an absent
//! `Option` as `none`, text as itself.

/// A value in a tallies snapshot, printed the way `inspect` shows it and
/// read back from that form (a report that carries `Stats::detail`, such
/// as the crash checker's, is read into the engine's `Tallies`).
pub trait Figure: Sized {
    /// The value as `Stats::detail` lists it.
    fn show(&self) -> String;
    /// The value `show` printed as `s`, or `None` if `s` is not one.
    fn read(s: &str) -> Option<Self>;
}

/// Figures printed by `Display` and read back by `FromStr`.
macro_rules! plain_figure {
    ($($t:ty),*) => {
        $(
            impl Figure for $t {
                fn show(&self) -> String {
                    self.to_string()
                }
                fn read(s: &str) -> Option<Self> {
                    s.parse().ok()
                }
            }
        )*
    };
}

plain_figure!(u64, u32, i64, bool, String);

/// A figure that may not exist yet (no split has happened, no insert has
/// failed): printed as `none` when absent.
impl<T: Figure> Figure for Option<T> {
    fn show(&self) -> String {
        match self {
            Some(v) => v.show(),
            None => "none".to_string(),
        }
    }
    fn read(s: &str) -> Option<Self> {
        match s {
            "none" => Some(None),
            _ => T::read(s).map(Some),
        }
    }
}

/// A real number printed to `P` decimal places (load factors, ratios,
/// milliseconds).
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd, Default)]
pub struct Fixed<const P: usize>(pub f64);

impl<const P: usize> Figure for Fixed<P> {
    fn show(&self) -> String {
        format!("{:.*}", P, self.0)
    }
    fn read(s: &str) -> Option<Self> {
        s.parse().ok().map(Fixed)
    }
}

/// A power of two, held as its exponent and printed as `2^k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Pow2(pub u32);

impl Pow2 {
    /// The number itself, `2^k`.
    pub fn value(self) -> u64 {
        1u64 << self.0
    }
}

impl Figure for Pow2 {
    fn show(&self) -> String {
        format!("2^{}", self.0)
    }
    fn read(s: &str) -> Option<Self> {
        s.strip_prefix("2^")?.parse().ok().map(Pow2)
    }
}

/// Declares an engine's tallies snapshot: a struct with one public field
/// per figure, each with the name `Stats::detail` lists it under, and a
/// `detail()` that lists them in declaration order. Each field's type
/// says how it prints ([`Figure`](crate::Figure)).
#[macro_export]
macro_rules! tallies {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$fmeta:meta])*
                $field:ident : $ty:ty => $label:literal
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq)]
        $vis struct $name {
            $(
                $(#[$fmeta])*
                pub $field: $ty,
            )*
        }

        impl $name {
            /// The figures as `Stats::detail` lists them (name, printed
            /// value), in declaration order.
            pub fn detail(&self) -> ::std::vec::Vec<(::std::string::String, ::std::string::String)> {
                ::std::vec![
                    $(
                        (
                            ::std::string::String::from($label),
                            $crate::Figure::show(&self.$field),
                        ),
                    )*
                ]
            }

            /// The snapshot that `detail` listed as `detail` (extra
            /// figures, such as a filter's after an engine's, are
            /// ignored), or `None` if a figure is missing or unreadable.
            pub fn from_detail(
                detail: &[(::std::string::String, ::std::string::String)],
            ) -> ::std::option::Option<Self> {
                let find = |label: &str| {
                    detail
                        .iter()
                        .find(|(name, _)| name == label)
                        .map(|(_, value)| value.as_str())
                };
                ::std::option::Option::Some($name {
                    $(
                        $field: $crate::Figure::read(find($label)?)?,
                    )*
                })
            }
        }
    };
}
