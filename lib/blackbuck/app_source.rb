# frozen_string_literal: true

require_relative "warmup"

module Blackbuck
  # Where the app comes from, decided once (the CLI, the rack handler) and handed to whoever needs
  # it: preloaded by the master (AppSource.preloaded: every worker of generation 0 forks from the
  # master), or booted by a mold (AppSource.booted_by_mold: the blackbuck command with refork_after;
  # the master holds only Blackbuck, Refork). It alone runs the warm-up and prepares the heap before
  # the first fork, in whichever process holds the app:
  #
  # - preloaded: #warm_up in the master before binding (Server.run), #prepare_heap right before
  #   the first fork (Supervisor#run);
  # - booted by a mold: #boot in the mold (Forker#booting_mold: load, warm up; the mold prepares its
  #   own heap before each fork, Mold#prepare_heap), nothing in the master; where no mold can be
  #   made (Refork#on? false) the master loads it after all (#load_in_master), and it is preloaded
  #   from then on.
  class AppSource
    def self.preloaded(app, config) = new(config, app: app)

    # loader: loads the app (the rackup file), in the process that calls #boot.
    def self.booted_by_mold(loader, config) = new(config, loader: loader)

    attr_reader :app # nil while a mold boots it

    def initialize(config, app: nil, loader: nil)
      @config = config
      @app = app
      @loader = loader
    end

    # Whether the master does not hold the app: a mold boots it.
    def mold_boots? = @app.nil?

    # In the master, before binding: a warm-up that fails the boot leaves no listener behind.
    def warm_up(logger)
      return if mold_boots?

      streams_check(logger)
      run_warmup(@app, logger)
    end

    # In the master, when no mold can be made: it loads and warms up the app itself. Returns it.
    def load_in_master(logger)
      @app = @loader.call
      @loader = nil
      streams_check(logger)
      run_warmup(@app, logger)
      @app
    end

    # In the mold that boots the app (Forker#booting_mold): loads it and runs the warm-up; returns it.
    # step: told what runs, for the line of a boot that fails.
    def boot(logger, step: ->(_) {})
      step.call("loading the app")
      app = @loader.call
      streams_check(logger)
      step.call("the warm-up")
      run_warmup(app, logger)
      app
    end

    # In the master, the last thing before its first fork (gc_before_fork): nothing of the boot
    # allocates after it (Warmup::Heap). A master without the app has nothing to prepare.
    def prepare_heap(logger)
      Warmup.prepare_heap(logger: logger) if @config[:gc_before_fork] && !mold_boots?
    end

    # The streams setting with a Rails app that keeps its per-request state per thread (Rails'
    # default isolation_level :thread, or a Rails before 7.0, which has no other): a body that waits
    # shares the thread's Active Record connection and CurrentAttributes with the requests served
    # meanwhile, and two streams' queries may interleave on one connection. The warning, or nil.
    # isolation: the app's ActiveSupport::IsolatedExecutionState, rails: whether Rails is loaded.
    def self.streams_warning(config, isolation: rails_isolation, rails: defined?(::Rails::Application) ? true : false)
      return nil unless config[:streams] && rails
      return nil if isolation&.isolation_level == :fiber

      why = isolation ? "its isolation_level is :thread" : "this Rails keeps it per thread"
      "streams is on, but this Rails app keeps its per-request state per thread (#{why}): a stream body " \
        "that waits shares the thread's Active Record connection and CurrentAttributes with the requests " \
        "served meanwhile; set config.active_support.isolation_level = :fiber (Rails >= 7.0), or turn streams off " \
        "(docs/CONFIGURATION.md, streams)"
    end

    def self.rails_isolation
      defined?(::ActiveSupport::IsolatedExecutionState) ? ::ActiveSupport::IsolatedExecutionState : nil
    end

    private

    def streams_check(logger)
      warning = AppSource.streams_warning(@config)
      logger.warn(warning) if warning
    end

    def run_warmup(app, logger)
      Warmup.new(@config, app, logger).run if Warmup.wanted?(@config)
    end
  end
end
