# Loads vagrant/Vagrantfile with a stand-in for Vagrant (tests/unit/test_vagrant.py), then either
#   ruby vagrantfile_trigger.rb VAGRANTFILE PORT TOKEN DATA_DIR   runs its "after up" trigger on a fake machine
#   ruby vagrantfile_trigger.rb --config VAGRANTFILE [ARG...]     prints what it configures, as JSON, with
#                                                                 ARGV as the vagrant command line; rsync is
#                                                                 "on PATH" unless NO_RSYNC is set
require "json"
require "pathname"

module Vagrant
  module Util
    module Which
      def self.which(_name) = ENV["NO_RSYNC"] ? nil : "/usr/bin/rsync"
    end
  end

  # Records what the Vagrantfile configures; keeps the trigger's ruby block.
  class Recorder
    attr_reader :calls

    def initialize(calls) = (@calls = calls)

    def method_missing(name, *args, **kw, &block)
      @calls << [name, args, kw]
      if name == :after
        t = Recorder.new(@calls)
        block.call(t)
        $trigger = t.instance_variable_get(:@ruby)
      elsif name == :ruby
        @ruby = block
      elsif name == :provider && block
        block.call(Recorder.new(@calls), Recorder.new(@calls))
      end
      Recorder.new(@calls)
    end

    def respond_to_missing?(*) = true
  end

  def self.configure(_version) = yield(Recorder.new([]))
end

def sleep(*) = nil # the trigger's retries, without the wait

if ARGV[0] == "--config"
  vagrantfile = ARGV[1]
  ARGV.replace(ARGV[2..])
  calls = nil
  Vagrant.define_singleton_method(:configure) { |_v, &b| rec = Vagrant::Recorder.new([]); b.call(rec); calls = rec.calls }
  load vagrantfile
  puts JSON.generate(calls.map { |name, args, kw| { "call" => name, "args" => args, "kw" => kw } })
  exit 0
end

vagrantfile, port, token, data_dir = ARGV
ENV["LABKIT_JUPYTER_PORT"] = port
load vagrantfile

UI = Struct.new(:out) do
  def success(msg) = puts("SUCCESS #{msg}")
  def info(msg) = puts("INFO #{msg}")
  def error(msg) = puts("ERROR #{msg}")
end
Provider = Struct.new(:none) do
  def capability?(_name) = false
end
Vm = Struct.new(:networks)
Config = Struct.new(:vm)
Communicate = Struct.new(:token) do
  def sudo(_cmd, _opts = {}) = yield(:stdout, "#{token}\n")
end
Machine = Struct.new(:ui, :provider, :config, :communicate, :data_dir)
machine = Machine.new(UI.new, Provider.new, Config.new(Vm.new([[:forwarded_port, { id: "jupyter", guest: 8888, host: Integer(port) }]])),
                      Communicate.new(token), Pathname.new(data_dir))
$trigger.call(nil, machine)
