// The compiled parts of spdlog and fmt, for the programs linked with
// DDPRUN_STATIC_TOOLS: Debian ships both as shared libraries only, but their
// implementations are in the headers (spdlog's *-inl.h, fmt's format-inl.h).
// This file is what their own src/*.cpp files compile, limited to what the
// programs use: the objects of the project are compiled against the shared
// builds (SPDLOG_COMPILED_LIB, FMT_SHARED) and call these symbols.
#if !defined(SPDLOG_COMPILED_LIB) || !defined(SPDLOG_FMT_EXTERNAL)
#error \
    "compile with spdlog::spdlog's definitions (SPDLOG_COMPILED_LIB, SPDLOG_FMT_EXTERNAL)"
#endif

#include <mutex>

#include "fmt/format-inl.h"
#include "spdlog/async.h"
#include "spdlog/async_logger-inl.h"
#include "spdlog/cfg/helpers-inl.h"
#include "spdlog/common-inl.h"
#include "spdlog/details/backtracer-inl.h"
#include "spdlog/details/file_helper-inl.h"
#include "spdlog/details/log_msg-inl.h"
#include "spdlog/details/log_msg_buffer-inl.h"
#include "spdlog/details/null_mutex.h"
#include "spdlog/details/os-inl.h"
#include "spdlog/details/periodic_worker-inl.h"
#include "spdlog/details/registry-inl.h"
#include "spdlog/details/thread_pool-inl.h"
#include "spdlog/logger-inl.h"
#include "spdlog/pattern_formatter-inl.h"
#include "spdlog/sinks/ansicolor_sink-inl.h"
#include "spdlog/sinks/base_sink-inl.h"
#include "spdlog/sinks/basic_file_sink-inl.h"
#include "spdlog/sinks/sink-inl.h"
#include "spdlog/sinks/stdout_color_sinks-inl.h"
#include "spdlog/sinks/stdout_sinks-inl.h"
#include "spdlog/spdlog-inl.h"

// fmt's src/format.cc (fmt 9 in Debian 12, 10 in Debian 13).
FMT_BEGIN_NAMESPACE
namespace detail {
template FMT_API auto dragonbox::to_decimal(float x) noexcept
    -> dragonbox::decimal_fp<float>;
template FMT_API auto dragonbox::to_decimal(double x) noexcept
    -> dragonbox::decimal_fp<double>;
template FMT_API locale_ref::locale_ref(const std::locale& loc);
template FMT_API auto locale_ref::get<std::locale>() const -> std::locale;
template FMT_API auto thousands_sep_impl(locale_ref)
    -> thousands_sep_result<char>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
template FMT_API void buffer<char>::append(const char*, const char*);
#if FMT_VERSION >= 100000
template FMT_API void vformat_to(buffer<char>&, string_view,
                                 typename vformat_args<>::type, locale_ref);
#else
template FMT_API void vformat_to(buffer<char>&, string_view,
                                 basic_format_args<FMT_BUFFER_CONTEXT(char)>,
                                 locale_ref);
#endif
template FMT_API auto thousands_sep_impl(locale_ref)
    -> thousands_sep_result<wchar_t>;
template FMT_API auto decimal_point_impl(locale_ref) -> wchar_t;
template FMT_API void buffer<wchar_t>::append(const wchar_t*, const wchar_t*);
}  // namespace detail
FMT_END_NAMESPACE

// spdlog's src/spdlog.cpp, src/color_sinks.cpp and src/stdout_sinks.cpp.
template SPDLOG_API spdlog::logger::logger(std::string name,
                                           sinks_init_list::iterator begin,
                                           sinks_init_list::iterator end);
template class SPDLOG_API spdlog::sinks::base_sink<std::mutex>;
template class SPDLOG_API spdlog::sinks::base_sink<spdlog::details::null_mutex>;
template class SPDLOG_API
    spdlog::sinks::ansicolor_sink<spdlog::details::console_mutex>;
template class SPDLOG_API
    spdlog::sinks::ansicolor_stdout_sink<spdlog::details::console_mutex>;
template class SPDLOG_API
    spdlog::sinks::ansicolor_stderr_sink<spdlog::details::console_mutex>;
template class SPDLOG_API
    spdlog::sinks::stdout_sink_base<spdlog::details::console_mutex>;
template class SPDLOG_API
    spdlog::sinks::stdout_sink<spdlog::details::console_mutex>;
template class SPDLOG_API
    spdlog::sinks::stderr_sink<spdlog::details::console_mutex>;
template SPDLOG_API std::shared_ptr<spdlog::logger>
spdlog::stdout_color_mt<spdlog::synchronous_factory>(
    const std::string& logger_name, color_mode mode);
template SPDLOG_API std::shared_ptr<spdlog::logger>
spdlog::stderr_color_mt<spdlog::synchronous_factory>(
    const std::string& logger_name, color_mode mode);
