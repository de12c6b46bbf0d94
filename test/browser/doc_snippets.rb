# frozen_string_literal: true

# The code blocks of README.md and docs/DEPLOY.md that the browser suite runs. A block is found by
# the section it is in and its language (and a line it must contain); the suite then substitutes
# only addresses, ports and paths. Every substitution must find its text, so a doc whose example
# changes fails the suite instead of running something else.
class DocSnippets
  Block = Struct.new(:file, :section, :lang, :text)

  def initialize(root)
    @root = root
  end

  # The fenced block of `lang` in the section whose "#"-heading matches `section` (a Regexp) in
  # `file`, the first that contains `containing` when given. Indented fences (inside a list item)
  # lose their indentation.
  def block(file, section:, lang:, containing: nil)
    found = blocks(file).find do |b|
      b.lang == lang && b.section.match?(section) && (containing.nil? || b.text.include?(containing))
    end
    found or raise "#{file}: no ```#{lang} block#{" with #{containing.inspect}" if containing} under a heading matching #{section.inspect}"
    Snippet.new(found.text, "#{file} (#{found.section}, ```#{lang})")
  end

  # The command line in a ```sh block of `section` that matches `pattern`, without its comment.
  def command(file, section:, pattern:)
    sh = blocks(file).select { |b| b.lang == "sh" && b.section.match?(section) }
    line = sh.flat_map { |b| b.text.lines }.find { |l| l.match?(pattern) }
    line or raise "#{file}: no command matching #{pattern.inspect} in a ```sh block under #{section.inspect}"
    Snippet.new(line.sub(/\s+#.*\z/m, "").strip, "#{file} (#{section.source}, command)")
  end

  # Every fenced block of `lang` in `file` (Block structs: its section heading and text), for
  # checks that read what the docs say rather than run it (test/unit/docs_test.rb).
  def blocks_in(file, lang:) = blocks(file).select { |b| b.lang == lang }

  private

  def blocks(file)
    section = ""
    fence = nil
    out = []
    File.readlines(File.join(@root, file)).each do |line|
      if fence
        if line.strip == "```"
          out << Block.new(file, section, fence[:lang], fence[:lines].join)
          fence = nil
        else
          fence[:lines] << line.delete_prefix(fence[:indent])
        end
      elsif (m = line.match(/\A(\s*)```(\w+)\s*\z/))
        fence = { indent: m[1], lang: m[2], lines: [] }
      elsif line.start_with?("#")
        section = line.strip
      end
    end
    out
  end
end

# The text of one doc example, to be changed only by exact substitutions that must each apply.
class Snippet
  attr_reader :text

  def initialize(text, origin)
    @text = text
    @origin = origin
  end

  # Replaces every occurrence of `from` (a String or Regexp) with `to`; raises when there is none.
  def sub(from, to)
    raise "#{@origin} no longer contains #{from.inspect}:\n#{@text}" unless @text.match?(from.is_a?(String) ? Regexp.new(Regexp.escape(from)) : from)

    Snippet.new(@text.gsub(from, to), @origin)
  end

  def to_s = @text
end
