use super::*;

#[test]
fn frames_are_counted_under_their_own_protocol() {
    let m = Metrics::default();
    m.protocol_frame(Protocol::Herald);
    m.protocol_frame(Protocol::Centrifugo);
    m.protocol_frame(Protocol::Centrifugo);
    let text = m.render();
    assert!(text.contains("herald_protocol_frames_total{protocol=\"herald\"} 1"), "{text}");
    assert!(text.contains("herald_protocol_frames_total{protocol=\"centrifugo\"} 2"), "{text}");
}

/// `/metrics` is a contract with dashboards and alerts: every name, help
/// text, type and label set stays as `exported.txt` lists it (its
/// descriptor lines in order, its series without their values). A change
/// here is a change of that contract, and of docs/configuration.md.
#[test]
fn exported_names_help_texts_and_types_are_the_listed_ones() {
    let expected = include_str!("exported.txt");
    let text = Metrics::default().render();
    let descriptors =
        |t: &str| t.lines().filter(|l| l.starts_with('#')).map(str::to_owned).collect::<Vec<_>>();
    // A family's series come out in no fixed order: compared as a set.
    let series = |t: &str, valued: bool| {
        let mut names: Vec<String> = t
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| if valued { l.rsplit_once(' ').map_or(l, |(name, _)| name) } else { l }.to_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(descriptors(&text), descriptors(expected));
    assert_eq!(series(&text, true), series(expected, false));
}
