// Opening and closing an RDM endpoint: provider choice, explicit binding, the real port,
// receive buffers, memory registration as the provider's MR mode demands.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "rdm_endpoint.h"
#include "tandem/log.h"
#include "tandem/thread_name.h"

namespace tandem::fabric {
namespace {

constexpr size_t kRmaChunk = 4u << 20;
constexpr int kPortAttempts = 5;
constexpr size_t kCqSize = 1024;

// Splits fi_av_straddr() output ("fi_sockaddr_in://127.0.0.1:4242", "fi_ns://127.0.0.1:4242")
// into host and port; port 0 when the format has no decimal port.
void ParseStrAddr(const std::string& s, std::string* host, uint16_t* port) {
  auto scheme = s.find("://");
  std::string rest = scheme == std::string::npos ? s : s.substr(scheme + 3);
  auto colon = rest.rfind(':');
  *host = rest.substr(0, colon);
  *port = 0;
  if (colon == std::string::npos) return;
  std::string digits = rest.substr(colon + 1);
  if (digits.empty() || digits.size() > 5 || digits.find_first_not_of("0123456789") != std::string::npos) return;
  unsigned long v = std::stoul(digits);
  if (v <= 65535) *port = static_cast<uint16_t>(v);
}

// A port the kernel says is free now, for providers that cannot bind port 0 themselves (shm
// names its endpoint after host:port literally).
uint16_t PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  socklen_t sl = sizeof(sa);
  uint16_t port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &sl) == 0) {
    port = ntohs(sa.sin_port);
  }
  close(fd);
  return port;
}

// A lock call that fails is a bug (a reader taking it twice, a corrupt lock): stop, loudly.
void MustLock(int e, const char* what) {
  if (e == 0) return;
  log::Error("fabric: {}: {}", what, std::strerror(e));
  std::abort();
}

}  // namespace

Status FiError(Code code, const std::string& what, int fi_ret) {
  int e = fi_ret < 0 ? -fi_ret : fi_ret;
  return Status(code, what + ": " + fi_strerror(e));
}

void CloseFid(fid* f, const char* what) {
  if (f == nullptr) return;
  int r = fi_close(f);
  if (r != 0) log::Warn("fabric: closing {}: {}", what, fi_strerror(-r));
}

WriterFirstLock::WriterFirstLock() {
  pthread_rwlockattr_t attr;
  MustLock(pthread_rwlockattr_init(&attr), "pthread_rwlockattr_init");
  MustLock(pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP),
           "pthread_rwlockattr_setkind_np");
  MustLock(pthread_rwlock_init(&rw_, &attr), "pthread_rwlock_init");
  pthread_rwlockattr_destroy(&attr);
}

WriterFirstLock::~WriterFirstLock() { pthread_rwlock_destroy(&rw_); }
void WriterFirstLock::lock() { MustLock(pthread_rwlock_wrlock(&rw_), "pthread_rwlock_wrlock"); }
void WriterFirstLock::unlock() { MustLock(pthread_rwlock_unlock(&rw_), "pthread_rwlock_unlock"); }
void WriterFirstLock::lock_shared() { MustLock(pthread_rwlock_rdlock(&rw_), "pthread_rwlock_rdlock"); }
void WriterFirstLock::unlock_shared() { MustLock(pthread_rwlock_unlock(&rw_), "pthread_rwlock_unlock"); }

void SignalCq(Handles& h) {
  if (!h.can_block || h.cq == nullptr) return;
  int r = fi_cq_signal(h.cq);
  if (r != 0) log::Debug("fabric: fi_cq_signal: {}", fi_strerror(-r));
}

RegionChange::RegionChange(Handles& h) : h_(h) {
  if (!h_.exclude_regions) return;
  SignalCq(h_);  // out of a blocking read, which holds provider_mu shared
  h_.provider_mu.lock();
}

RegionChange::~RegionChange() {
  if (h_.exclude_regions) h_.provider_mu.unlock();
}

Handles::~Handles() {
  CloseFid(ep ? &ep->fid : nullptr, "endpoint");
  CloseFid(av ? &av->fid : nullptr, "address vector");
  CloseFid(cq ? &cq->fid : nullptr, "completion queue");
  CloseFid(domain ? &domain->fid : nullptr, "domain");
  CloseFid(fabric ? &fabric->fid : nullptr, "fabric");
  if (info) fi_freeinfo(info);
}

fi_info* MakeHints(const std::string& provider) {
  // Ask for what we need and offer every MR mode we can honour; the provider says which apply.
  fi_info* hints = fi_allocinfo();
  hints->caps = FI_MSG | FI_RMA;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->tx_attr->msg_order = FI_ORDER_SAS;
  hints->rx_attr->msg_order = FI_ORDER_SAS;
  hints->fabric_attr->prov_name = strdup(provider.c_str());
  return hints;
}

// The stacks to ask for, in order. "tcp" is libfabric's TCP transport at its best: its native
// RDM protocol, which 1.17 calls `net` (from 1.18 on it is `tcp` itself and rxm is no longer
// layered over tcp), round-trips about 6 us faster than tcp;ofi_rxm (H100 VM, through this
// layer: 12.2 against 18.0 us; a CUDA launch + synchronize 31.9 against 40.4 us), so on 1.17
// "tcp" tries `net` first and falls back to tcp;ofi_rxm where `net` is not offered (FI_PROVIDER
// filters it out). "tcp;ofi_rxm" asks for that stack alone.
std::vector<std::string> ProviderStacks(const std::string& provider) {
  if (provider == "tcp" && fi_version() < FI_VERSION(1, 18)) return {"net", "tcp"};
  return {provider};
}

std::string LibfabricVersion() {
  uint32_t v = fi_version();
  return std::to_string(FI_MAJOR(v)) + "." + std::to_string(FI_MINOR(v));
}

Result<std::unique_ptr<Endpoint>> RdmEndpoint::Open(const Options& options) {
  std::string host, service;
  if (!options.listen.empty() && !SplitHostPort(options.listen, &host, &service)) {
    return Status::Invalid("fabric: bad listen address '" + options.listen + "' (want host:port)");
  }
  if (options.max_message == 0 || options.recv_buffers <= 0) {
    return Status::Invalid("fabric: max_message and recv_buffers must be positive");
  }
  // Port 0: the provider picks (tcp, verbs) or, where it keeps 0 literally (shm), we do.
  bool any_port = !service.empty() && service == "0";
  Status last;
  for (int attempt = 0; attempt < (any_port ? kPortAttempts : 1); ++attempt) {
    std::string svc = service;
    if (attempt > 0) {
      uint16_t p = PickFreePort();
      if (p == 0) break;
      svc = std::to_string(p);
    }
    std::unique_ptr<RdmEndpoint> ep(new RdmEndpoint());
    last = ep->OpenAt(options, host, svc);
    if (last.ok() && (!any_port || ep->port_ != 0)) return std::unique_ptr<Endpoint>(std::move(ep));
    if (last.ok()) log::Debug("fabric: {} keeps port 0 literally; picking a free port", ep->provider_);
    else log::Debug("fabric: open {}:{} failed ({}); retrying", host, svc, last.message());
  }
  if (last.ok()) last = Status(Code::kInternal, "fabric: no free port found for " + options.listen);
  return last;
}

Status RdmEndpoint::OpenAt(const Options& options, const std::string& host, const std::string& service) {
  std::string provider = options.provider.empty() ? ProviderFromEnv() : options.provider;
  listening_ = !options.listen.empty();
  spin_us_ = options.spin_us;
  hand_off_idle_us_ = options.hand_off_idle_us;
  send_timeout_ = options.send_timeout;
  h_ = std::make_shared<Handles>();

  int r = -FI_ENODATA;
  for (const std::string& stack : ProviderStacks(provider)) {
    fi_info* hints = MakeHints(stack);
    // A listener binds explicitly (the first result is often eth0, not the address asked for).
    r = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), listening_ ? host.c_str() : nullptr,
                   listening_ ? service.c_str() : nullptr, listening_ ? FI_SOURCE : 0, hints, &h_->info);
    fi_freeinfo(hints);
    if (r == 0) break;
    // A warning: a peer that got net cannot talk to this one (its connects time out).
    if (stack == "net")
      log::Warn("fabric: libfabric offers no 'net' here ({}{}): \"tcp\" falls back to tcp;ofi_rxm, which peers on "
                "net cannot reach", fi_strerror(-r), std::getenv("FI_PROVIDER") ? ", FI_PROVIDER is set" : "");
    else
      log::Debug("fabric: no RDM endpoint from '{}' ({})", stack, fi_strerror(-r));
  }
  if (r != 0) {
    return FiError(Code::kUnimplemented,
                   "fabric: no RDM endpoint from provider '" + provider + "'" +
                       (listening_ ? " at " + host + ":" + service : std::string()),
                   r);
  }
  fi_info* info = h_->info;
  provider_ = info->fabric_attr->prov_name;
  h_->exclude_regions = provider_ == "net" || provider_ == "tcp";
  mr_mode_ = info->domain_attr->mr_mode;
  inject_size_ = info->tx_attr->inject_size;
  size_t max_msg = info->ep_attr->max_msg_size;
  max_message_ = std::min(options.max_message, max_msg - wire::kHeaderSize);
  rma_chunk_ = std::min(kRmaChunk, max_msg);

  if ((r = fi_fabric(info->fabric_attr, &h_->fabric, nullptr)) != 0) return FiError(Code::kInternal, "fi_fabric", r);
  if ((r = fi_domain(h_->fabric, info, &h_->domain, nullptr)) != 0) return FiError(Code::kInternal, "fi_domain", r);
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  if ((r = fi_av_open(h_->domain, &av_attr, &h_->av, nullptr)) != 0) return FiError(Code::kInternal, "fi_av_open", r);

  // A CQ with a wait object lets the progress thread block; without one it naps instead.
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.size = kCqSize;
  cq_attr.wait_obj = FI_WAIT_UNSPEC;
  r = fi_cq_open(h_->domain, &cq_attr, &h_->cq, nullptr);
  h_->can_block = r == 0;
  if (r != 0) {
    log::Debug("fabric: {} CQ without wait object ({}); progress thread will nap", provider_, fi_strerror(-r));
    cq_attr.wait_obj = FI_WAIT_NONE;
    if ((r = fi_cq_open(h_->domain, &cq_attr, &h_->cq, nullptr)) != 0) return FiError(Code::kInternal, "fi_cq_open", r);
  }

  if ((r = fi_endpoint(h_->domain, info, &h_->ep, nullptr)) != 0) return FiError(Code::kInternal, "fi_endpoint", r);
  if ((r = fi_ep_bind(h_->ep, &h_->av->fid, 0)) != 0) return FiError(Code::kInternal, "fi_ep_bind(av)", r);
  if ((r = fi_ep_bind(h_->ep, &h_->cq->fid, FI_TRANSMIT | FI_RECV)) != 0) {
    return FiError(Code::kInternal, "fi_ep_bind(cq)", r);
  }
  if ((r = fi_enable(h_->ep)) != 0) return FiError(Code::kLinkLost, "fi_enable at " + host + ":" + service, r);

  // Our raw address goes into CONNECT; its printable form gives the real port.
  size_t len = 0;
  r = fi_getname(&h_->ep->fid, nullptr, &len);
  if (r != -FI_ETOOSMALL && r != 0) return FiError(Code::kInternal, "fi_getname", r);
  my_address_.resize(len);
  if ((r = fi_getname(&h_->ep->fid, my_address_.data(), &len)) != 0) return FiError(Code::kInternal, "fi_getname", r);
  my_address_.resize(len);
  char text[256];
  size_t text_len = sizeof(text);
  fi_av_straddr(h_->av, my_address_.data(), text, &text_len);
  std::string bound_host;
  ParseStrAddr(text, &bound_host, &port_);
  address_ = (listening_ ? host : bound_host) + ":" + std::to_string(port_);

  TANDEM_RETURN_IF_ERROR(PostReceives(options.recv_buffers));
  progress_ = std::thread([this] { NameThisThread("tdm-progress"); ProgressLoop(); });
  log::Debug("fabric: {} endpoint {} ({}), mr_mode {:#x}, inject {} B", provider_, address_, text, mr_mode_,
             inject_size_);
  return Status::Ok();
}

bool RdmEndpoint::mr_local() const { return (mr_mode_ & FI_MR_LOCAL) != 0; }

Result<fid_mr*> RdmEndpoint::RegisterRaw(void* addr, size_t len, uint64_t access) {
  // Without FI_MR_PROV_KEY the keys are ours to choose, unique per domain.
  uint64_t key = (mr_mode_ & FI_MR_PROV_KEY) ? 0 : next_key_.fetch_add(1);
  fid_mr* mr = nullptr;
  int r = fi_mr_reg(h_->domain, addr, len, access, 0, key, 0, &mr, nullptr);
  if (r != 0) return FiError(Code::kOutOfMemory, "fi_mr_reg of " + std::to_string(len) + " bytes", r);
  if (mr_mode_ & FI_MR_ENDPOINT) {
    if ((r = fi_mr_bind(mr, &h_->ep->fid, 0)) != 0 || (r = fi_mr_enable(mr)) != 0) {
      CloseFid(&mr->fid, "memory region");
      return FiError(Code::kInternal, "fi_mr_bind/fi_mr_enable", r);
    }
  }
  return mr;
}

Result<Buffer> RdmEndpoint::NewBuffer(size_t bytes) {
  Buffer b;
  size_t n = bytes ? bytes : wire::kHeaderSize + max_message_;
  b.pooled = bytes == 0;
  b.data.reset(new uint8_t[n]);
  if (mr_local()) {
    auto mr = RegisterRaw(b.data.get(), n, FI_SEND | FI_RECV);
    if (!mr.ok()) return mr.status();
    b.mr = *mr;
    b.desc = fi_mr_desc(b.mr);
  }
  return b;
}

void RdmEndpoint::FreeBuffer(Buffer& b) {
  // Not a RegionChange (nor is NewBuffer's registration): only a provider that wants
  // FI_MR_LOCAL registers send and receive buffers, and net, whose key map needs
  // RegionChange, does not.
  CloseFid(b.mr ? &b.mr->fid : nullptr, "buffer region");
  b.mr = nullptr;
  b.data.reset();
}

Status RdmEndpoint::PostReceives(int count) {
  for (int i = 0; i < count; ++i) {
    auto slot = std::make_unique<RecvSlot>();
    auto buf = NewBuffer();
    if (!buf.ok()) return buf.status();
    slot->buf = std::move(*buf);
    ssize_t r = PostRecv(*slot);
    if (r != 0) return FiError(Code::kInternal, "fi_recv", static_cast<int>(r));
    recv_slots_.push_back(std::move(slot));
  }
  return Status::Ok();
}

RdmEndpoint::~RdmEndpoint() {
  // Tell connected peers we are going (best effort: a dead peer must not delay us).
  std::vector<std::pair<fi_addr_t, uint64_t>> up;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, c] : peers_) {
      if (c->state == Conn::State::kUp) up.emplace_back(c->addr, c->conn_id);
    }
  }
  for (auto& [addr, conn_id] : up) SendBye(addr, conn_id);
  if (progress_.joinable()) {
    stop_ = true;
    Kick();
    progress_.join();
  }
  // Closing the endpoint cancels what is still posted; only then may the contexts go.
  if (h_ && h_->ep) {
    CloseFid(&h_->ep->fid, "endpoint");
    h_->ep = nullptr;
  }
  for (auto& s : recv_slots_) FreeBuffer(s->buf);
  for (auto& b : free_buffers_) FreeBuffer(b);
  for (auto& op : control_deferred_) FreeBuffer(op->buf);
  for (SendOp* op : sends_in_flight_) {
    FreeBuffer(op->buf);
    delete op;
  }
}

}  // namespace tandem::fabric
