#pragma once
// Bytes in and out of one accepted socket, plain or TLS, never blocking. TLS is OpenSSL on
// the SSL_CTX that Poco NetSSL builds from the certificate files (so certificate loading and
// its errors stay as they are), driven non-blocking here so that the event loop owns it.

#include <Poco/Net/Context.h>

#include <cstddef>
#include <memory>
#include <string>

namespace vllmd::daemon::http {

struct IoResult {
  enum class Status {
    kOk,          // `bytes` moved
    kWouldBlock,  // try again when the socket is ready (writable, when `wants_write`)
    kClosed,      // the peer ended its side
    kError,       // the connection is broken
    kNotTls,      // plain HTTP on the TLS port
  };
  Status status = Status::kOk;
  std::size_t bytes = 0;
  bool wants_write = false;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual IoResult read(char* data, std::size_t size) = 0;
  virtual IoResult write(const char* data, std::size_t size) = 0;
  // After the last response: no more bytes from us (TLS close_notify, then FIN).
  virtual void shutdown_write() = 0;
  // Bytes already received and decrypted but not read yet: the socket will not report them.
  virtual bool pending() const { return false; }
};

std::unique_ptr<Transport> plain_transport(int fd);

class TlsContext {
 public:
  // Loads the certificate and key (key empty: in the certificate file); TLS 1.2 and newer.
  // Throws Poco::Net::SSLException (or Poco::Exception) when they cannot be used.
  TlsContext(const std::string& cert_file, const std::string& key_file);
  std::unique_ptr<Transport> accept(int fd) const;

 private:
  Poco::AutoPtr<Poco::Net::Context> context_;
};

}  // namespace vllmd::daemon::http
