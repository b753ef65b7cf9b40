//! Google Cloud Vertex AI's custom-container variables, read from the environment as
//! llama-server reads them: `AIP_MODE=PREDICTION` turns the predict route on
//! (`AIP_PREDICT_ROUTE`, `/predict` by default), `AIP_HEALTH_ROUTE` adds a health route and
//! `AIP_HTTP_PORT` (8080 by default) replaces `--port`. The hidden options of the same names
//! set them per server (the tests run several servers in one process).

/// The Vertex AI variables, flattened into [`super::Args`].
#[derive(Clone, Debug, Default, clap::Args)]
pub struct GcpArgs {
    /// `PREDICTION` serves Vertex AI's prediction protocol.
    #[arg(long = "aip-mode", hide = true, env = "AIP_MODE")]
    pub aip_mode: Option<String>,
    /// The port Vertex AI sends requests to (replaces `--port` in prediction mode).
    #[arg(long = "aip-http-port", hide = true, env = "AIP_HTTP_PORT")]
    pub aip_http_port: Option<u16>,
    /// A path that answers as `/health` does.
    #[arg(long = "aip-health-route", hide = true, env = "AIP_HEALTH_ROUTE")]
    pub aip_health_route: Option<String>,
    /// The path of the predict route.
    #[arg(long = "aip-predict-route", hide = true, env = "AIP_PREDICT_ROUTE")]
    pub aip_predict_route: Option<String>,
}

/// Vertex AI's routes, when prediction mode is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gcp {
    /// The predict route (`/predict` unless `AIP_PREDICT_ROUTE` names another).
    pub predict: String,
    /// The extra health route, if `AIP_HEALTH_ROUTE` names one.
    pub health: Option<String>,
    /// The port to listen on.
    pub port: u16,
}

/// `path` with a leading slash; `None` when empty.
fn route(path: Option<&str>) -> Option<String> {
    match path? {
        "" => None,
        p if p.starts_with('/') => Some(p.to_owned()),
        p => Some(format!("/{p}")),
    }
}

impl GcpArgs {
    /// The routes to serve, or `None` unless `AIP_MODE` is `PREDICTION`.
    pub fn routes(&self) -> Option<Gcp> {
        if self.aip_mode.as_deref() != Some("PREDICTION") {
            return None;
        }
        Some(Gcp {
            predict: route(self.aip_predict_route.as_deref()).unwrap_or_else(|| "/predict".into()),
            health: route(self.aip_health_route.as_deref()),
            port: self.aip_http_port.unwrap_or(8080),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prediction_mode_routes_and_port() {
        assert_eq!(GcpArgs::default().routes(), None);
        let off = GcpArgs {
            aip_mode: Some("TRAINING".into()),
            ..GcpArgs::default()
        };
        assert_eq!(off.routes(), None);
        let on = GcpArgs {
            aip_mode: Some("PREDICTION".into()),
            ..GcpArgs::default()
        };
        let want = Gcp {
            predict: "/predict".into(),
            health: None,
            port: 8080,
        };
        assert_eq!(on.routes(), Some(want));
        let named = GcpArgs {
            aip_mode: Some("PREDICTION".into()),
            aip_http_port: Some(9000),
            aip_health_route: Some("v1/ping".into()),
            aip_predict_route: Some("v1/models/m:predict".into()),
        };
        let want = Gcp {
            predict: "/v1/models/m:predict".into(),
            health: Some("/v1/ping".into()),
            port: 9000,
        };
        assert_eq!(named.routes(), Some(want));
    }
}
