// The C++ program probefs-probe's tests probe (and perf's -F is compared on): namespaces,
// overloads, a template, constructors and destructors, an operator, a lambda, virtual
// methods, a member inlined at -O2, std::string. Built at -O0 and -O2 with DWARF.
//
//   probe_shop_OPT N     prices N orders and prints one line per order,
//                        "ITEM QTY DISCOUNT PRICE", then "total TOTAL"
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace shop {

struct Order {
  std::string item;
  int qty;
  double unit;
};

class Pricer {
 public:
  explicit Pricer(double tax) : tax_(tax) {}
  virtual ~Pricer() = default;
  // Two overloads: with a discount and without.
  [[gnu::noinline]] virtual double price(const Order& o, int discount) const {
    return o.qty * o.unit * (1 + tax_) - discount;
  }
  [[gnu::noinline]] double price(const Order& o) const { return price(o, 0); }
  bool operator<(const Pricer& other) const { return tax_ < other.tax_; }
  double tax() const { return tax_; }  // inlined at -O2

 protected:
  double tax_;
};

class BulkPricer : public Pricer {
 public:
  explicit BulkPricer(double tax) : Pricer(tax) {}
  [[gnu::noinline]] double price(const Order& o, int discount) const override {
    return Pricer::price(o, discount + (o.qty >= 10 ? 5 : 0));
  }
};

template <typename T>
[[gnu::noinline]] T twice(T v) {
  return v + v;
}

}  // namespace shop

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 3;
  shop::Pricer plain(0.25);
  shop::BulkPricer bulk(0.125);
  std::vector<shop::Order> orders;
  for (int i = 0; i < n; ++i)
    orders.push_back({i % 2 ? "pear" : "apple", shop::twice(i + 1) * 3, 1.5 + i});
  double total = 0;
  auto charge = [&](const shop::Order& o, int discount) {
    const shop::Pricer& p = o.qty >= 10 ? static_cast<const shop::Pricer&>(bulk) : plain;
    const double price = discount ? p.price(o, discount) : p.price(o);
    std::printf("%s %d %d %.3f\n", o.item.c_str(), o.qty, discount, price);
    total += price;
  };
  for (int i = 0; i < n; ++i) charge(orders[i], i % 3);
  std::printf("total %.3f %d %g\n", total, plain < bulk, shop::twice(plain.tax()));
  return 0;
}
