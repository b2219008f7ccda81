//! The command table: what each command takes ([`TABLE`], also what
//! `COMMAND` reports and the names `CLIENT LIST` shows), and [`lookup`]
//! of a name in it.

/// One argument, as `COMMAND DOCS` describes it.
pub(crate) struct Arg {
    pub(crate) name: &'static str,
    /// `key`, `string`, `integer`, `pattern` or `pure-token`.
    pub(crate) kind: &'static str,
    pub(crate) optional: bool,
    pub(crate) multiple: bool,
}

const fn a(name: &'static str, kind: &'static str) -> Arg {
    Arg {
        name,
        kind,
        optional: false,
        multiple: false,
    }
}
const fn opt(name: &'static str, kind: &'static str) -> Arg {
    Arg {
        name,
        kind,
        optional: true,
        multiple: false,
    }
}
const fn many(name: &'static str, kind: &'static str) -> Arg {
    Arg {
        name,
        kind,
        optional: false,
        multiple: true,
    }
}

/// What a command takes.
pub(crate) struct Spec {
    pub(crate) name: &'static str,
    /// Redis's convention: `n` exactly n words (the name included), `-n`
    /// at least n.
    pub(crate) arity: i64,
    pub(crate) flags: &'static [&'static str],
    /// First key, last key (-1: the last word), step; (0, 0, 0): none.
    pub(crate) keys: (i64, i64, i64),
    /// Works on the whole keyspace (inside `EXEC` it takes every stripe).
    pub(crate) global: bool,
    pub(crate) group: &'static str,
    pub(crate) summary: &'static str,
    pub(crate) args: &'static [Arg],
}

const NOKEY: (i64, i64, i64) = (0, 0, 0);
const KEY1: (i64, i64, i64) = (1, 1, 1);
const KEYS: (i64, i64, i64) = (1, -1, 1);

macro_rules! spec {
    ($name:literal, $arity:expr, $flags:expr, $keys:expr, $global:expr, $group:literal, $summary:literal, [$($arg:expr),*]) => {
        Spec {
            name: $name,
            arity: $arity,
            flags: $flags,
            keys: $keys,
            global: $global,
            group: $group,
            summary: $summary,
            args: &[$($arg),*],
        }
    };
}

/// Every command the server knows (the hot ones first: a lookup walks it).
pub(crate) static TABLE: &[Spec] = &[
    spec!(
        "GET",
        2,
        &["readonly", "fast"],
        KEY1,
        false,
        "string",
        "Returns the value of a key.",
        [a("key", "key")]
    ),
    spec!(
        "SET",
        -3,
        &["write", "denyoom"],
        KEY1,
        false,
        "string",
        "Sets the value of a key (NX, XX, GET; no expiry).",
        [
            a("key", "key"),
            a("value", "string"),
            opt("nx", "pure-token"),
            opt("xx", "pure-token"),
            opt("get", "pure-token")
        ]
    ),
    spec!(
        "MGET",
        -2,
        &["readonly", "fast"],
        KEYS,
        false,
        "string",
        "Returns the values of one or more keys.",
        [many("key", "key")]
    ),
    spec!(
        "MSET",
        -3,
        &["write", "denyoom"],
        (1, -1, 2),
        false,
        "string",
        "Sets one or more keys, isolated from readers.",
        [many("key value", "string")]
    ),
    spec!(
        "DEL",
        -2,
        &["write"],
        KEYS,
        false,
        "keyspace",
        "Deletes one or more keys.",
        [many("key", "key")]
    ),
    spec!(
        "UNLINK",
        -2,
        &["write", "fast"],
        KEYS,
        false,
        "keyspace",
        "Deletes one or more keys.",
        [many("key", "key")]
    ),
    spec!(
        "EXISTS",
        -2,
        &["readonly", "fast"],
        KEYS,
        false,
        "keyspace",
        "Counts how many of the keys exist.",
        [many("key", "key")]
    ),
    spec!(
        "INCR",
        2,
        &["write", "denyoom", "fast"],
        KEY1,
        false,
        "string",
        "Increments the integer value of a key by one.",
        [a("key", "key")]
    ),
    spec!(
        "DECR",
        2,
        &["write", "denyoom", "fast"],
        KEY1,
        false,
        "string",
        "Decrements the integer value of a key by one.",
        [a("key", "key")]
    ),
    spec!(
        "INCRBY",
        3,
        &["write", "denyoom", "fast"],
        KEY1,
        false,
        "string",
        "Increments the integer value of a key by a number.",
        [a("key", "key"), a("increment", "integer")]
    ),
    spec!(
        "DECRBY",
        3,
        &["write", "denyoom", "fast"],
        KEY1,
        false,
        "string",
        "Decrements the integer value of a key by a number.",
        [a("key", "key"), a("decrement", "integer")]
    ),
    spec!(
        "GETSET",
        3,
        &["write", "denyoom", "fast"],
        KEY1,
        false,
        "string",
        "Sets a key and returns its old value.",
        [a("key", "key"), a("value", "string")]
    ),
    spec!(
        "PING",
        -1,
        &["fast"],
        NOKEY,
        false,
        "connection",
        "Returns PONG, or the argument.",
        [opt("message", "string")]
    ),
    spec!(
        "ECHO",
        2,
        &["fast"],
        NOKEY,
        false,
        "connection",
        "Returns the argument.",
        [a("message", "string")]
    ),
    spec!(
        "SCAN",
        -2,
        &["readonly"],
        NOKEY,
        true,
        "keyspace",
        "Walks the keys in key order, a page per call.",
        [
            a("cursor", "integer"),
            opt("pattern", "pattern"),
            opt("count", "integer")
        ]
    ),
    spec!(
        "RANGE",
        -3,
        &["readonly"],
        NOKEY,
        true,
        "keyspace",
        "Returns key, value pairs with start <= key < end, in key order (pmhash's own command).",
        [
            a("start", "string"),
            a("end", "string"),
            opt("limit", "integer")
        ]
    ),
    spec!(
        "DBSIZE",
        1,
        &["readonly", "fast"],
        NOKEY,
        true,
        "server",
        "Returns the number of keys.",
        []
    ),
    spec!(
        "FLUSHALL",
        -1,
        &["write"],
        NOKEY,
        true,
        "server",
        "Deletes every key.",
        []
    ),
    spec!(
        "FLUSHDB",
        -1,
        &["write"],
        NOKEY,
        true,
        "server",
        "Deletes every key.",
        []
    ),
    spec!(
        "MULTI",
        1,
        &["fast", "no-multi"],
        NOKEY,
        false,
        "transactions",
        "Starts a transaction.",
        []
    ),
    spec!(
        "EXEC",
        1,
        &["no-multi"],
        NOKEY,
        false,
        "transactions",
        "Runs the queued commands of a transaction.",
        []
    ),
    spec!(
        "DISCARD",
        1,
        &["fast", "no-multi"],
        NOKEY,
        false,
        "transactions",
        "Drops the queued commands of a transaction.",
        []
    ),
    spec!(
        "WATCH",
        -2,
        &["fast", "no-multi"],
        KEYS,
        false,
        "transactions",
        "Makes the next EXEC fail if a key changes first.",
        [many("key", "key")]
    ),
    spec!(
        "UNWATCH",
        1,
        &["fast"],
        NOKEY,
        false,
        "transactions",
        "Forgets every watched key.",
        []
    ),
    spec!(
        "AUTH",
        -2,
        &["no-auth", "fast"],
        NOKEY,
        false,
        "connection",
        "Authenticates the connection.",
        [opt("username", "string"), a("password", "string")]
    ),
    spec!(
        "HELLO",
        -1,
        &["no-auth", "fast"],
        NOKEY,
        false,
        "connection",
        "Handshakes: protocol version, AUTH, SETNAME.",
        [opt("protover", "integer")]
    ),
    spec!(
        "QUIT",
        -1,
        &["no-auth", "fast"],
        NOKEY,
        false,
        "connection",
        "Closes the connection.",
        []
    ),
    spec!(
        "SELECT",
        2,
        &["fast"],
        NOKEY,
        false,
        "connection",
        "Selects database 0 (the only one).",
        [a("index", "integer")]
    ),
    spec!(
        "CLIENT",
        -2,
        &[],
        NOKEY,
        false,
        "connection",
        "LIST, KILL, ID, SETNAME, GETNAME, SETINFO, INFO.",
        [a("subcommand", "string")]
    ),
    spec!(
        "INFO",
        -1,
        &[],
        NOKEY,
        false,
        "server",
        "Returns figures about the server, by section.",
        [opt("section", "string")]
    ),
    spec!(
        "COMMAND",
        -1,
        &[],
        NOKEY,
        false,
        "server",
        "COUNT, INFO, DOCS, LIST: the commands this server knows.",
        [opt("subcommand", "string")]
    ),
    spec!(
        "CONFIG",
        -2,
        &[],
        NOKEY,
        false,
        "server",
        "CONFIG GET pattern: the settings clients ask for.",
        [a("subcommand", "string")]
    ),
    spec!(
        "SAVE",
        1,
        &[],
        NOKEY,
        false,
        "server",
        "Makes every completed write durable.",
        []
    ),
    spec!(
        "BGSAVE",
        -1,
        &[],
        NOKEY,
        false,
        "server",
        "Makes every completed write durable.",
        []
    ),
    spec!(
        "SHUTDOWN",
        -1,
        &[],
        NOKEY,
        false,
        "server",
        "Stops the server and closes the store cleanly.",
        []
    ),
];

/// The table entry for a command name, any case.
pub(crate) fn lookup(name: &[u8]) -> Option<usize> {
    TABLE
        .iter()
        .position(|s| s.name.as_bytes().eq_ignore_ascii_case(name))
}
