//! The web console: served from the binary's embedded files when enabled
//! (`auto` = with dev mode), never otherwise; its session endpoint needs the
//! API key outside dev mode; the page may only talk to its own origin.

use herald_server::config::ConsoleSetting;
use herald_test_support::{TestServer, API_KEY};

async fn get(url: &str, bearer: Option<&str>) -> reqwest::Response {
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let mut req = client.get(url);
    if let Some(b) = bearer {
        req = req.bearer_auth(b);
    }
    req.send().await.expect("http request")
}

#[tokio::test]
async fn dev_mode_serves_the_embedded_console() {
    let server = TestServer::start().await; // dev = true, console = auto
    let page = get(&format!("{}/console/", server.url), None).await;
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    let csp = page.headers()["content-security-policy"].to_str().unwrap().to_owned();
    assert!(csp.contains("connect-src 'self'") && csp.contains("script-src 'self'"), "{csp}");
    assert!(page.text().await.unwrap().contains("<script type=\"module\" src=\"console.js\">"));

    let bundle = get(&format!("{}/console/herald-client.js", server.url), None).await;
    assert_eq!(bundle.status(), 200);
    assert_eq!(bundle.headers()["content-type"], "text/javascript; charset=utf-8");
    let js = bundle.text().await.unwrap();
    assert_eq!(
        js,
        include_str!("../../herald-server/console/herald-client.js"),
        "the committed bundle, byte for byte"
    );
    assert!(js.contains("var Herald = class"));

    let redirect = get(&format!("{}/console", server.url), None).await;
    assert_eq!(redirect.status(), 308);
    assert_eq!(redirect.headers()["location"], "/console/");

    for missing in ["/console/nope.js", "/console/..%2Fconsole.rs"] {
        assert_eq!(get(&format!("{}{missing}", server.url), None).await.status(), 404, "{missing}");
    }
    let session: serde_json::Value =
        get(&format!("{}/console/session", server.url), None).await.json().await.unwrap();
    assert_eq!(session["dev"], true);
    assert_eq!(session["jwt"], true);
    server.stop().await;
}

#[tokio::test]
async fn outside_dev_mode_the_console_is_off_unless_enabled_and_its_session_needs_the_api_key() {
    let off = TestServer::start_with(|c| c.dev = false).await;
    assert_eq!(get(&format!("{}/console/", off.url), None).await.status(), 404, "auto without dev: off");
    assert_eq!(get(&format!("{}/console/session", off.url), Some(API_KEY)).await.status(), 404);
    off.stop().await;

    let on = TestServer::start_with(|c| {
        c.dev = false;
        c.console = ConsoleSetting::On;
    })
    .await;
    // The page itself is public code; what it shows needs credentials.
    assert_eq!(get(&format!("{}/console/", on.url), None).await.status(), 200);
    let anonymous = get(&format!("{}/console/session", on.url), None).await;
    assert_eq!(anonymous.status(), 401);
    let wrong = get(&format!("{}/console/session", on.url), Some("not-a-key-0123456789")).await;
    assert_eq!(wrong.status(), 401);
    let ok = get(&format!("{}/console/session", on.url), Some(API_KEY)).await;
    assert_eq!(ok.status(), 200);
    let body: serde_json::Value = ok.json().await.unwrap();
    assert_eq!(body["dev"], false);
    on.stop().await;

    let disabled = TestServer::start_with(|c| c.console = ConsoleSetting::Off).await;
    assert_eq!(get(&format!("{}/console/", disabled.url), None).await.status(), 404, "off even in dev mode");
    disabled.stop().await;
}
