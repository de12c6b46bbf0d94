# frozen_string_literal: true

module Blackbuck
  # A bad option, directive, address or rackup file: the CLI prints the message and exits non-zero.
  class ConfigError < StandardError
    # A SyntaxError's message as one line, "path:LINE: syntax error, WHAT". Ruby 3.1's parser says
    # "path:2: syntax error, unexpected end-of-input"; Prism (3.4, 4.0) says "path:2: syntax errors
    # found", then the source lines, then one "^~ what" line per problem: the first problem is kept.
    def self.syntax(err)
      head, *rest = err.message.lines.map(&:chomp)
      return head unless head.end_with?(": syntax errors found", ": syntax error found")

      first = rest.filter_map { |l| l[/\A\s*\|\s*\^~*\s+(.+)\z/, 1] }.first
      first ? head.sub(/syntax errors? found\z/, "syntax error, #{first}") : head
    end
  end

  # Raised inside the app (from a signal trap) when a request runs past --timeout.
  class RequestTimeout < Exception # rubocop:disable Lint/InheritException -- must not be rescued by `rescue => e`
    RAILS_STATUS = :service_unavailable # what Rails answers it with: 503, as Blackbuck itself does

    # Rails' ShowExceptions rescues every exception and answers the status its rescue_responses
    # names, 500 for one it does not know: a loaded Rails app learns that a request timeout is a 503.
    # An entry the app set itself (config.action_dispatch.rescue_responses) stands. Called once the
    # app is loaded; does nothing without Rails (Rails stays optional).
    def self.register_with_rails
      return unless defined?(ActionDispatch::ExceptionWrapper)

      responses = ActionDispatch::ExceptionWrapper.rescue_responses # (its default: :internal_server_error)
      responses[name] = RAILS_STATUS unless responses.key?(name)
    end
  end

  # Raised in a stream body where it waits (a `sleep`, a `Queue#pop`: Scheduler) when the worker stops
  # and graceful_timeout is over: the stream ends cleanly (its body closed, the last chunk written). An
  # Exception, not a StandardError, so a body's `rescue => e` does not swallow it; a body that rescues
  # it anyway gets it again at its next wait.
  class StreamStop < Exception # rubocop:disable Lint/InheritException -- as RequestTimeout
  end
end
