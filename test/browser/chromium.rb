# frozen_string_literal: true

require "ferrum"

# Debian's headless Chromium, driven over the DevTools protocol by Ferrum: one browser (its own
# profile, its own download directory) per test, stopped by #quit (Ferrum kills its process group
# by pid). It resolves no host name but localhost, so it can only reach this machine.
class Chromium
  PATHS = %w[/usr/bin/chromium /usr/bin/chromium-browser].freeze
  TIMEOUT = 20 # seconds: a bound for one page load or command that went wrong, not a measure

  def self.path = PATHS.find { |p| File.executable?(p) }

  attr_reader :download_dir

  def initialize(download_dir)
    @download_dir = download_dir
    @browser = Ferrum::Browser.new(
      browser_path: Chromium.path, headless: true, timeout: TIMEOUT, process_timeout: 60,
      browser_options: {
        "no-sandbox" => nil, # tests run as root
        "no-proxy-server" => nil,
        "host-resolver-rules" => "MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1 , EXCLUDE [::1]" # nothing but loopback
      }
    )
    page.downloads.set_behavior(save_path: download_dir)
  end

  def page = @browser.page

  def quit
    @browser&.quit
  end

  # Opens url as a new document (a full load, what typing it does). Returns the seconds from the
  # start of the navigation to the end of its load event (the Navigation Timing API's numbers).
  def visit(url)
    page.network.clear(:traffic)
    page.go_to(url)
    wait_for("the load event of #{url}") { js("document.readyState") == "complete" && load_ms.positive? }
    load_ms / 1000.0
  end

  def url = js("location.href")
  def js(expression) = page.evaluate(expression)
  def text(css) = page.at_css(css)&.text.to_s

  # Once the network is idle, the requests of the current document that failed, answered with an
  # error or are still unanswered: "STATUS URL" each.
  def failed_requests
    page.network.wait_for_idle(timeout: TIMEOUT)
    page.network.traffic.filter_map do |ex|
      status = ex.response&.status
      next if status && status < 400 && ex.finished?

      "#{status || ex.error&.error_text || 'unanswered'} #{ex.request&.url}"
    end
  end

  def fill_in(css, value)
    node = wait_for("#{css} on #{url}") { page.at_css(css) }
    node.focus.type(value)
  end

  # Clicks the element at css where a user would, scrolled into view first.
  def click(css) = wait_for("#{css} on #{url}") { page.at_css(css) }.scroll_into_view.click

  # Clicks what Turbo handles (a link, a form's submit button) and waits until Turbo has finished the
  # visit it starts, redirects followed (its turbo:load event, counted in the document: a full page
  # load would start the count again, and the wait would fail).
  def turbo_click(css)
    page.execute("if (!window.bbTurboLoads) { window.bbTurboLoads = 1; document.addEventListener('turbo:load', () => window.bbTurboLoads++) }")
    before = js("window.bbTurboLoads")
    click(css)
    wait_for("Turbo's visit after clicking #{css}") { js("window.bbTurboLoads").to_i > before }
  end

  # Clicks the link at css and waits for the file it downloads; returns the file's path.
  def download(css, timeout: 60)
    page.downloads.wait(timeout) { click(css) }
    file = page.downloads.files.last
    raise "no download started by #{css}" unless file
    raise "download #{file['state']}: #{file.inspect}" unless file["state"] == "completed"

    File.join(download_dir, file["suggestedFilename"])
  end

  # Polls the block until it is truthy (returned) or raises after timeout.
  def wait_for(what, timeout = TIMEOUT)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    loop do
      v = begin
        yield
      rescue Ferrum::NodeNotFoundError, Ferrum::JavaScriptError
        nil
      end
      return v if v
      raise "#{what}: not seen within #{timeout}s (at #{url}):\n#{page_text}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.05
    end
  end

  private

  def page_text = text("body")[0, 2000]

  def load_ms = js("(performance.getEntriesByType('navigation')[0] || {}).loadEventEnd || 0").to_f
end
