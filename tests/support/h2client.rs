//! A blocking HTTP/2 client for tests: one h2c connection (the `h2` crate's client on
//! a one-thread tokio runtime owned by the client), requests one at a time, answers
//! read whole with their trailers.

use bytes::Bytes;
use h2::client::SendRequest;
use std::time::Duration;

/// How long one exchange may take (longer: the server hung).
const EXCHANGE_CAP: Duration = Duration::from_secs(60);

/// A response as the client got it.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
    pub trailers: Option<http::HeaderMap>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

pub struct H2Client {
    runtime: tokio::runtime::Runtime,
    send: SendRequest<Bytes>,
    port: u16,
}

impl H2Client {
    /// Connects to `127.0.0.1:port` and speaks HTTP/2 at once (prior knowledge).
    pub fn connect(port: u16) -> H2Client {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .expect("a tokio runtime for the h2 client");
        let send = runtime.block_on(async {
            let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("connect");
            let (send, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
            tokio::spawn(async move {
                let _ = connection.await;
            });
            send
        });
        H2Client {
            runtime,
            send,
            port,
        }
    }

    /// `method path` with `fields` and, if given, a body; the whole answer.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        fields: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Result<Answer, h2::Error> {
        let mut b = http::Request::builder()
            .method(method)
            .uri(format!("http://localhost:{}{path}", self.port));
        for (name, value) in fields {
            b = b.header(*name, *value);
        }
        let request = b.body(()).unwrap();
        let send = self.send.clone();
        let body = body.map(Bytes::copy_from_slice);
        self.runtime.block_on(async move {
            let exchange = async move {
                let mut send = send.ready().await?;
                let (response, mut upload) = send.send_request(request, body.is_none())?;
                if let Some(mut body) = body {
                    // Within the stream's window: send as the server grants it.
                    while !body.is_empty() {
                        upload.reserve_capacity(body.len());
                        let granted = std::future::poll_fn(|cx| upload.poll_capacity(cx))
                            .await
                            .expect("capacity")?;
                        let piece = body.split_to(granted.min(body.len()));
                        upload.send_data(piece, body.is_empty())?;
                    }
                }
                read_answer(response).await
            };
            tokio::time::timeout(EXCHANGE_CAP, exchange)
                .await
                .unwrap_or_else(|_| panic!("no answer in {EXCHANGE_CAP:?}"))
        })
    }
}

impl H2Client {
    /// Sends `method path` (no body) and returns at once: the answer is read with
    /// [`H2Client::finish`], other streams may go meanwhile.
    // The future is returned on purpose, not awaited: the answer is read later.
    #[allow(clippy::async_yields_async)]
    pub fn start(&mut self, method: &str, path: &str) -> h2::client::ResponseFuture {
        let request = http::Request::builder()
            .method(method)
            .uri(format!("http://localhost:{}{path}", self.port))
            .body(())
            .unwrap();
        let send = self.send.clone();
        self.runtime.block_on(async move {
            let mut send = send.ready().await.expect("the connection takes a stream");
            let (response, _) = send.send_request(request, true).expect("a stream");
            response
        })
    }

    /// The whole answer of a stream [`H2Client::start`] sent.
    pub fn finish(&mut self, response: h2::client::ResponseFuture) -> Result<Answer, h2::Error> {
        self.runtime.block_on(async move {
            tokio::time::timeout(EXCHANGE_CAP, read_answer(response))
                .await
                .unwrap_or_else(|_| panic!("no answer in {EXCHANGE_CAP:?}"))
        })
    }
}

/// The whole answer of `response`, the window given back as it is read.
pub async fn read_answer(response: h2::client::ResponseFuture) -> Result<Answer, h2::Error> {
    let response = response.await?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let mut stream = response.into_body();
    let mut body = Vec::new();
    while let Some(chunk) = stream.data().await {
        let chunk = chunk?;
        let _ = stream.flow_control().release_capacity(chunk.len());
        body.extend_from_slice(&chunk);
    }
    let trailers = stream.trailers().await?;
    Ok(Answer {
        status,
        headers,
        body,
        trailers,
    })
}
