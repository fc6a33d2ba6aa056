#include "daemon/http/transport.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

namespace vllmd::daemon::http {

namespace {

using Status = IoResult::Status;

IoResult from_errno(ssize_t n) {
  if (n > 0) return {Status::kOk, static_cast<std::size_t>(n)};
  if (n == 0) return {Status::kClosed};
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return {Status::kWouldBlock};
  return {Status::kError};
}

class PlainTransport final : public Transport {
 public:
  explicit PlainTransport(int fd) : fd_(fd) {}
  IoResult read(char* data, std::size_t size) override {
    return from_errno(::recv(fd_, data, size, MSG_DONTWAIT));
  }
  IoResult write(const char* data, std::size_t size) override {
    const ssize_t n = ::send(fd_, data, size, MSG_DONTWAIT | MSG_NOSIGNAL);
    return n == 0 ? IoResult{Status::kWouldBlock} : from_errno(n);
  }
  void shutdown_write() override { ::shutdown(fd_, SHUT_WR); }

 private:
  int fd_;
};

class TlsTransport final : public Transport {
 public:
  TlsTransport(int fd, SSL_CTX* context) : fd_(fd), ssl_(SSL_new(context)) {
    if (ssl_ != nullptr) {
      SSL_set_fd(ssl_, fd);
      SSL_set_accept_state(ssl_);
      SSL_set_mode(ssl_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    }
  }
  ~TlsTransport() override { SSL_free(ssl_); }
  TlsTransport(const TlsTransport&) = delete;
  TlsTransport& operator=(const TlsTransport&) = delete;

  IoResult read(char* data, std::size_t size) override {
    if (ssl_ == nullptr) return {Status::kError};
    if (!checked_first_byte_) {
      // A TLS record starts with 0x16; a letter is a plain HTTP request on the wrong scheme.
      char first = 0;
      const ssize_t n = ::recv(fd_, &first, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n <= 0) return from_errno(n);
      checked_first_byte_ = true;
      if (first >= 'A' && first <= 'Z') return {Status::kNotTls};
    }
    ERR_clear_error();
    const int n = SSL_read(ssl_, data, static_cast<int>(std::min<std::size_t>(size, 1 << 30)));
    return n > 0 ? IoResult{Status::kOk, static_cast<std::size_t>(n)} : failure(n);
  }

  IoResult write(const char* data, std::size_t size) override {
    if (ssl_ == nullptr) return {Status::kError};
    ERR_clear_error();
    const int n = SSL_write(ssl_, data, static_cast<int>(std::min<std::size_t>(size, 1 << 30)));
    return n > 0 ? IoResult{Status::kOk, static_cast<std::size_t>(n)} : failure(n);
  }

  bool pending() const override { return ssl_ != nullptr && SSL_pending(ssl_) > 0; }

  void shutdown_write() override {
    if (ssl_ != nullptr && SSL_is_init_finished(ssl_)) SSL_shutdown(ssl_);
    ::shutdown(fd_, SHUT_WR);
  }

 private:
  IoResult failure(int n) {
    switch (SSL_get_error(ssl_, n)) {
      case SSL_ERROR_WANT_READ: return {Status::kWouldBlock};
      case SSL_ERROR_WANT_WRITE: return {Status::kWouldBlock, 0, true};
      case SSL_ERROR_ZERO_RETURN: return {Status::kClosed};
      case SSL_ERROR_SYSCALL:
        // An EOF without close_notify is how most clients end a connection.
        return errno == 0 || errno == ECONNRESET ? IoResult{Status::kClosed}
                                                 : IoResult{Status::kError};
      default: return {Status::kError};
    }
  }

  int fd_;
  SSL* ssl_;
  bool checked_first_byte_ = false;
};

}  // namespace

std::unique_ptr<Transport> plain_transport(int fd) { return std::make_unique<PlainTransport>(fd); }

TlsContext::TlsContext(const std::string& cert_file, const std::string& key_file) {
  Poco::Net::Context::Params params;
  params.certificateFile = cert_file;
  params.privateKeyFile = key_file.empty() ? cert_file : key_file;
  params.verificationMode = Poco::Net::Context::VERIFY_NONE;  // clients authenticate by key
  params.loadDefaultCAs = false;
  params.cipherList = "HIGH:!aNULL:!eNULL:!MD5:!RC4:!3DES";
  context_ = new Poco::Net::Context(Poco::Net::Context::TLS_SERVER_USE, params);
  context_->disableProtocols(Poco::Net::Context::PROTO_SSLV2 | Poco::Net::Context::PROTO_SSLV3 |
                             Poco::Net::Context::PROTO_TLSV1 | Poco::Net::Context::PROTO_TLSV1_1);
}

std::unique_ptr<Transport> TlsContext::accept(int fd) const {
  return std::make_unique<TlsTransport>(fd, context_->sslContext());
}

}  // namespace vllmd::daemon::http
