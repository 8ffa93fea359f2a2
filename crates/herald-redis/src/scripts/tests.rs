//! Every `.lua` file's header names its `KEYS` and `ARGV` in the order its
//! argument struct pushes them.

use super::args::*;

/// The `KEYS:` and `ARGV:` sections of a script's leading comment, without
/// whitespace (a section may wrap onto `--` continuation lines).
fn header(source: &str) -> (String, String) {
    let text: String = source
        .lines()
        .take_while(|l| l.starts_with("--"))
        .map(|l| l.trim_start_matches('-'))
        .collect::<Vec<_>>()
        .join(" ")
        .split_whitespace()
        .collect();
    let keys_at = text.find("KEYS:").expect("a KEYS: line");
    let argv_at = text.find("ARGV:").expect("an ARGV: line");
    (text[keys_at + 5..argv_at].to_owned(), text[argv_at + 5..].to_owned())
}

fn expected(names: Vec<String>) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(",")
    }
}

fn check(name: &str, source: &str, keys: Vec<String>, argv: Vec<String>) {
    let (k, a) = header(source);
    assert_eq!(k, expected(keys), "{name}: KEYS in the header and the struct differ");
    assert_eq!(a, expected(argv), "{name}: ARGV in the header and the struct differ");
}

fn checked<S: ScriptArgs>(name: &str) {
    check(name, S::SOURCE, S::keys(), S::argv());
}

#[test]
fn lua_headers_match_the_argument_structs() {
    check("Append", Append::SOURCE, Append::keys(), Append::argv());
    checked::<Read>("Read");
    checked::<Check>("Check");
    checked::<BumpEpoch>("BumpEpoch");
    checked::<Ack>("Ack");
    checked::<NodeLeaseKeep>("NodeLeaseKeep");
    checked::<NodeLeaseRelease>("NodeLeaseRelease");
    checked::<OwnClaim>("OwnClaim");
    checked::<OwnRelease>("OwnRelease");
    checked::<PresenceJoin>("PresenceJoin");
    checked::<PresenceRenew>("PresenceRenew");
    checked::<PresenceLeave>("PresenceLeave");
    checked::<PresenceRejoin>("PresenceRejoin");
    checked::<PresenceList>("PresenceList");
    checked::<PresenceCount>("PresenceCount");
    checked::<PresenceHasUser>("PresenceHasUser");
    checked::<PresenceSweep>("PresenceSweep");
    checked::<IndexLower>("IndexLower");
    checked::<IndexClaim>("IndexClaim");
    checked::<IndexSettle>("IndexSettle");
    checked::<RoomWrite>("RoomWrite");
    checked::<SchedAdd>("SchedAdd");
    checked::<SchedClaim>("SchedClaim");
    checked::<SchedDeliver>("SchedDeliver");
    checked::<SchedCancel>("SchedCancel");
}

#[test]
fn every_lua_file_has_an_argument_struct() {
    // The scripts above plus the two shared preludes.
    let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/src/scripts"))
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().ok())
        .filter(|n| n.ends_with(".lua"))
        .count();
    assert_eq!(files, 25 + 2);
}

#[test]
fn gone_placeholders_are_filled() {
    let text = super::gone_text();
    assert!(!text.contains("${"), "a placeholder left in gone.lua: {text}");
}
